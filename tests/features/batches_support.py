"""Helpers shared by test_batches.py and the files split from it."""

from __future__ import annotations

from typing import Any

import redis

import echomq


def _app(url: str, qname: str) -> tuple[echomq.App, dict[str, Any]]:
    app = echomq.App(url=url)

    @app.task(queue=qname, name="member")
    def member(n: int) -> int:
        return n

    @app.task(queue=qname, name="cb")
    def cb(tag: str) -> None:
        return None

    return app, {"member": member, "cb": cb}


def _drain(q: echomq.Queue, fail: set[str] = frozenset()) -> list[echomq.Job]:  # type: ignore[assignment]
    """Claim and settle every runnable job: members in ``fail`` die (max_attempts 1), every
    other job completes. The callbacks met on the way, in order."""
    seen: list[echomq.Job] = []
    while (job := q.claim()) is not None:
        if job.id in fail:
            q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom")
        else:
            q.complete(job.id, job.token)
        seen.append(job)
    return seen


def _keys(r: redis.Redis, qname: str) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for k in sorted(r.scan_iter(match=f"emq:{{{qname}}}:*")):
        out[k] = r.dump(k)
    return out
