"""Issue 36, item 1: what ``echomq job`` shows as attempts. The attempts ``max_attempts``
counts (``attempts - floor``, as ``Job.attempt``), and how many claims the row saw when some
are not counted (a shutdown's hand-back, a RateLimit push-back, an earlier incarnation)."""

from __future__ import annotations

from click.testing import CliRunner

import echomq
from echomq.cli import main
from echomq.protocol import control as _ctl


def _job(url: str, qname: str, job_id: str) -> list[str]:
    result = CliRunner(env={"COLUMNS": "400", "ECHOMQ_URL": None}).invoke(
        main, ["--url", url, "job", qname, job_id]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout.splitlines()


def test_job_counts_attempts_from_the_floor(url: str, q: echomq.Queue, qname: str) -> None:
    e = q.enqueue(b"x")
    for _ in range(2):  # two runs handed back (push_back 0: what a shutdown does)
        job = q.claim(lease_ms=60_000)
        assert job is not None
        q._x.run(_ctl.push_back(q._k, e.id, job.token, 0))
    job = q.claim(lease_ms=60_000)
    assert job is not None and (job.token, job.attempt) == (3, 1)
    lines = _job(url, qname, e.id)
    assert "attempts: 1 (claimed 3 times; 2 not counted: hand-backs, push-backs, reruns)" in lines
    assert not any(line.startswith("floor:") for line in lines)
    # A plain job: the attempts as before.
    e2 = q.enqueue(b"y")
    assert "attempts: 0" in _job(url, qname, e2.id)


def test_job_lists_count_attempts_from_the_floor(url: str, q: echomq.Queue, qname: str) -> None:
    """The lists (``echomq browse``, the dashboard's, ``ops.console.rows``) show the same count
    as ``echomq job``: a handed-back run is not an attempt."""
    from echomq.ops import console as _console
    from echomq.ops import snapshots as _inspect

    e = q.enqueue(b"x")
    job = q.claim(lease_ms=60_000)
    assert job is not None
    q._x.run(_ctl.push_back(q._k, e.id, job.token, 0))
    job = q.claim(lease_ms=60_000)
    assert job is not None and job.token == 2
    page = _inspect.page(q._x, q._k, "active")
    (row,) = _console.rows(q._x, q._k, page.items, page.state)
    assert (row.id, row.attempts) == (e.id, 1)
    result = CliRunner(env={"COLUMNS": "400", "ECHOMQ_URL": None}).invoke(
        main, ["--url", url, "browse", qname, "--state", "active"]
    )
    assert result.exit_code == 0, result.output
    head, *lines = result.stdout.splitlines()
    (line,) = [ln for ln in lines if ln.startswith(e.id)]
    at = head.index("attempts")  # right-aligned under its header
    assert line[at : at + len("attempts")].strip() == "1", (head, line)
