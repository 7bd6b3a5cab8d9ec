"""Sharded queues on the command line: ``reshard`` grows one, ``shards`` lists its shards.

``echomq reshard QUEUE N`` grows QUEUE to N shards (issue 43: growth only). The new shards
are appended to the stored list; jobs already queued stay where they are and every worker
serving QUEUE picks the new shards up on its beat, so nothing moves, is lost or doubled.
Shrinking is refused with the procedure (drain, obliterate, recreate). The read commands
(``stats``, ``check``, ``browse``, ``top``, ``scale``) show a sharded queue's sums under its
logical name (``echomq.ops.sharded``).
"""

from __future__ import annotations

import click

from echomq.cli._common import _CREATE, _existing, _fail, _run, main
from echomq.client import shardkit
from echomq.client import shards as _shards
from echomq.errors import EchoMQError, StateError
from echomq.protocol import calls as _p
from echomq.protocol import registry as _registry


@main.command()
@click.argument("queue")
@click.argument("n", type=int)
@_CREATE
@click.pass_context
def reshard(ctx: click.Context, queue: str, n: int, create: bool) -> None:
    """Grow QUEUE to N shards (growth only: jobs never move; the workers serving QUEUE
    serve the new shards within a few seconds). Prints the stored shard list. Shrinking is
    refused with the procedure; exit 1 when QUEUE does not exist (--create: make it
    sharded before its first job)."""
    if not 1 <= n <= _shards.MAX_SHARDS:
        _fail(f"N is a number of shards in 1..{_shards.MAX_SHARDS}, got {n}")
    q = _existing(ctx, queue, create=create, verb="shard")
    stored: list[str] = _run(ctx, lambda: q._x.run(_p.shards(q._k)))
    if n < len(stored):
        _fail(str(shardkit.shrink(queue, len(stored), n)))
    try:
        names = _shards.grow(queue, stored, n)
        if len(names) > len(stored):
            shardkit.serving(queue, _run(ctx, lambda: q._x.run(_registry.list_workers(q._k))))
    except EchoMQError as exc:
        _fail(str(exc))

    def propose() -> list[str]:
        try:
            return q._x.run(_p.propose_shards(q._k, names))
        except StateError as exc:  # a queue-wide limit or rate limit: say what to clear
            raise shardkit.as_limited(queue, exc) or exc from exc

    after: list[str] = _run(ctx, propose)
    if after == stored:
        click.echo(f"{queue} has {len(after)} shards already")
    else:
        click.echo(f"{queue}: {len(stored)} -> {len(after)} shards")
    for i, name in enumerate(after):
        click.echo(f"  {i} {name} (slot {_shards.slot_of(name)})")


@main.command("shards")
@click.argument("queue")
@click.pass_context
def shards(ctx: click.Context, queue: str) -> None:
    """The shards of QUEUE (its stored list; a plain queue is its own one shard), with each
    one's cluster slot; exit 1 when QUEUE does not exist."""
    q = _existing(ctx, queue)
    stored: list[str] = _run(ctx, lambda: q._x.run(_p.shards(q._k)))
    for i, name in enumerate(stored):
        click.echo(f"{i} {name} (slot {_shards.slot_of(name)})")
