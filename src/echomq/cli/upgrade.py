"""Upgrading a deployment: ``migrate`` (issue 39, docs/guides/upgrading.md)."""

from __future__ import annotations

import click

from echomq.cli._common import _checked_queues, _errors, _url, main
from echomq.client import executor as _executor
from echomq.client import layout as _layout
from echomq.client import native as _native
from echomq.ops import migrate as _migrate


@main.command()
@click.option("--dry-run", is_flag=True, help="Count what is left to migrate; write nothing.")
@click.option("--queue", "queues", multiple=True, help="Migrate this queue only (repeatable).")
@click.option(
    "--batch",
    default=_migrate.DEFAULT_BATCH,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Members per atomic step.",
)
@click.pass_context
def migrate(ctx: click.Context, dry_run: bool, queues: tuple[str, ...], batch: int) -> None:
    """Bring the deployment's data to this release's layout: idempotent, resumable (the
    progress is kept on the server), safe beside running workers of the previous release.
    Run it once every worker runs this release; a run over every queue then records the
    layout. Prints one line per queue and the layout."""
    url = _url(ctx)
    _checked_queues(queues)

    def told(p: _migrate.Progress) -> None:
        if dry_run:
            state = f"{p.left} to migrate" if p.left else "nothing to migrate"
        elif p.migrated:
            state = f"migrated {p.migrated} in {p.batches} steps"
        else:
            state = "already done" if p.was_done else "nothing to migrate"
        click.echo(f"{p.queue}: {p.migration}: {state}")

    with _errors(url):
        client = _executor.sync_client(url)
        try:
            x = _executor.SyncExecutor(
                client, retry_for=0, executor=_native.resolve_executor(None, url)
            )
            done = _migrate.migrate(
                x, client, queues=list(queues) or None, dry_run=dry_run, batch=batch, told=told
            )
            layout = _migrate.recorded_layout(x)
        finally:
            client.close()
    if not done:
        click.echo("no queues found")
    shown = layout if layout is not None else f"{_layout.UNRECORDED} (not recorded)"
    click.echo(f"data layout: {shown}; this release writes {_layout.LAYOUT}")
