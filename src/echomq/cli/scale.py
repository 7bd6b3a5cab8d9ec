"""``echomq backlog``: the autoscaling signal, for scripts and scalers.

``echomq backlog``: the autoscaling signal of queues, for scripts and scalers
(``echomq.ops.backlog`` says what counts)."""

from __future__ import annotations

import json

import click

from echomq import keyspace
from echomq.cli._common import _errors, _existing, _fail, _url, main
from echomq.client import executor as _executor
from echomq.client import native as _native
from echomq.errors import EchoMQError
from echomq.ops import backlog as _backlog


@main.command()
@click.argument("queues", nargs=-1, required=True)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per queue, a line each: queue, backlog, oldest_wait_s, waiting, "
    "due, scheduled, active, paused.",
)
@click.pass_context
def backlog(ctx: click.Context, queues: tuple[str, ...], as_json: bool) -> None:
    """Work a new worker could take now in QUEUES (waiting plus due delayed jobs; 0 while
    paused) and how long the oldest of it has waited."""
    for name in queues:
        try:
            keyspace.check_queue(name)
        except EchoMQError as exc:
            _fail(str(exc))
    for name in queues:  # a typo is said, not shown as an empty backlog
        _existing(ctx, name)
    url = _url(ctx)
    with _errors(url):
        client = _executor.sync_client(url)
        try:
            x = _executor.SyncExecutor(
                client, retry_for=0, executor=_native.resolve_executor(None, url)
            )
            found = _backlog.backlogs(x, list(queues))
        finally:
            client.close()
    for b in found:
        if as_json:
            click.echo(json.dumps(b.as_dict()))
            continue
        age = "-" if b.oldest_wait_s is None else f"{b.oldest_wait_s:.1f}s"
        paused = "  paused" if b.paused else ""
        click.echo(
            f"{b.queue}  backlog {b.backlog:,}  oldest {age}  "
            f"(waiting {b.waiting:,}, due {b.due:,}, scheduled {b.scheduled:,}, "
            f"active {b.active:,}){paused}"
        )
