"""Helpers shared by test_bad_input.py and the files split from it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LANE = "PRT0KHTOWnGLuC"


LANE_B = "tenant-b"


ABSENT = "JOB0KHTOWnGLuC"  # well-formed, never enqueued


def populate(q: Any) -> dict[str, Any]:
    """Jobs in every state: completed, dead (flat and lane), active (flat and lane), scheduled,
    pending (flat and lane), plus logs, progress and lane settings."""
    out: dict[str, Any] = {}
    done = q.enqueue(b"done")
    job = q.claim(lease_ms=60_000)
    q.complete(job.id, job.token)
    out["done"] = done.id
    for key, group in (("dead", None), ("dead_lane", LANE_B)):
        jid = q.enqueue(b"dead", group=group).id
        job = q.claim(lease_ms=60_000)
        assert job.id == jid
        assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
        out[key] = jid
    out["active"] = q.enqueue(b"active").id
    held = q.claim(lease_ms=60_000)
    assert held.id == out["active"]
    out["token"] = held.token
    q.enqueue(b"active-lane", group=LANE)
    out["active_lane"] = q.claim(lease_ms=60_000).id
    out["scheduled"] = q.enqueue(b"later", delay_ms=600_000).id
    out["pending"] = q.enqueue(b"pending").id
    out["lane"] = q.enqueue(b"lane", group=LANE).id
    q.enqueue(b"lane-b", group=LANE_B)
    q.add_log(out["pending"], "a line")
    q.update_progress(out["pending"], "5")
    q.weight_lane(LANE, 2)
    q.limit_lane(LANE_B, 3)
    q.pause_lane(LANE_B)
    assert q.counts() == {
        "pending": 3,
        "active": 2,
        "schedule": 1,
        "dead": 2,
        "completed": 1,
        "failed": 2,
        "kept": 0,
    }
    return out


Case = Callable[[Any, dict[str, Any]], Any]
