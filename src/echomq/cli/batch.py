"""``echomq batch QUEUE ID``: one batch's status (issue 42, docs/guides/batches.md)."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from echomq.cli._common import _fail, _queue, _run, main
from echomq.errors import StateError
from echomq.tasks import batches as _batches


@main.command()
@click.argument("queue")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (for scripts).")
@click.option("--failed", default=_batches.FAILED_IDS, show_default=True, help="Failed ids shown.")
@click.pass_context
def batch(ctx: click.Context, queue: str, batch_id: str, as_json: bool, failed: int) -> None:
    """Show one batch: its members' counts, the dead members' ids, whether it is closed and
    which callbacks fired. Exits 1 when no batch has that id (never opened, or finished and
    gone)."""
    q = _queue(ctx, queue)

    def show() -> int:
        try:
            st = q._x.run(_batches.status(q._k, batch_id, failed))
        except StateError as exc:
            _fail(f"no batch {batch_id} on queue {queue!r} ({exc.reason})", code=1)
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(st), sort_keys=True))
            return 0
        click.echo(f"batch: {st.id}\nqueue: {st.queue}")
        if st.description:
            click.echo(f"description: {st.description}")
        click.echo(
            f"total: {st.total}  pending: {st.pending}  succeeded: {st.succeeded}  dead: {st.dead}"
        )
        click.echo(f"closed: {st.closed}  complete: {st.complete}  success: {st.success}")
        if st.first_death:
            click.echo(f"first death: {st.first_death}")
        for jid in st.failed_ids:
            click.echo(f"  dead: {jid}")
        return 0

    sys.exit(_run(ctx, show))
