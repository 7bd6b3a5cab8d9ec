"""Repeat limits (limit, until, lowered limits, the periodic registry) and an app flow's
wait and await of the root's result.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from job_controls_support import (
    _fire_now,
)

import echomq
from conftest import snapshot


def test_repeat_limit_stops_after_n_fires(q: echomq.Queue, r: redis.Redis) -> None:
    assert q.repeat("r", b"x", every_ms=60_000, limit=2) == "registered"
    assert _fire_now(q, r, "r") == 1
    [rep] = q.repeats()
    assert (rep.fired, rep.limit, rep.ended) == (1, 2, False)
    assert _fire_now(q, r, "r") == 1
    [rep] = q.repeats()
    assert rep.fired == 2 and rep.ended and rep.next_ms is None
    # Spent: it stays listed, never due again; re-registering with the same limit keeps it so.
    assert q.fire_due() == 0
    assert q.repeat("r", b"x", every_ms=60_000, limit=2) == "updated"
    assert q.repeats()[0].ended
    # A higher limit revives it, the count kept.
    q.repeat("r", b"x", every_ms=60_000, limit=3)
    assert not q.repeats()[0].ended
    assert _fire_now(q, r, "r") == 1
    assert q.repeats()[0].ended and q.counts()["pending"] == 3
    assert q.check() == []


def test_repeat_until_ms_stops_at_its_end(q: echomq.Queue, r: redis.Redis) -> None:
    now = int(r.time()[0]) * 1000
    q.repeat("u", b"x", every_ms=60_000, until_ms=now + 1)
    assert q.repeats()[0].ended  # its first fire (now + every_ms) is past the end
    assert _fire_now(q, r, "u") == 1  # a fire due in the past (the test's clock) is before it
    [rep] = q.repeats()
    assert rep.ended and rep.until_ms == now + 1  # its next fire (after now) passes the end
    q.repeat("past", b"x", every_ms=60_000, until_ms=1)
    assert [x.ended for x in q.repeats() if x.name == "past"] == [True]


@pytest.mark.parametrize("bad", [{"limit": 0}, {"limit": -1}, {"limit": 1.5}, {"until_ms": -1}])
def test_bad_repeat_limits_are_refused(q: echomq.Queue, r: redis.Redis, bad: Any) -> None:
    before = snapshot(r, q.name)
    with pytest.raises(echomq.InvalidArgument):
        q.repeat("r", b"x", every_ms=1000, **bad)
    app = echomq.App(url=None)
    with pytest.raises(echomq.InvalidArgument):
        app.periodic(every_ms=1000, **bad)
    assert snapshot(r, q.name) == before


def test_periodic_limit_reaches_the_registry(url: str, qname: str, r: redis.Redis) -> None:
    from echomq.protocol import compose as _compose

    app = echomq.App(url=url)

    @app.periodic(every_ms=60_000, queue=qname, limit=5, until_ms=10**13)
    def tick() -> None:
        return None

    try:
        q = app.queue(qname)
        q._x.run(app.sync_periodic(q._k))
        [rep] = q.repeats()
        assert (rep.limit, rep.until_ms, rep.fired) == (5, 10**13, 0)
        assert isinstance(rep, _compose.Repeat)
    finally:
        app.close()


def _flow_app(url: str, qname: str) -> tuple[echomq.App, Any, Any, Any]:
    app = echomq.App(url=url)

    @app.task(queue=qname, keep_result_ms=60_000)
    def square(x: int) -> int:
        return x * x

    @app.task(queue=qname, keep_result_ms=60_000)
    def total() -> int:
        ctx = echomq.current_job()
        assert ctx is not None
        return sum(ctx.children_values().values())

    @app.task(queue=qname, keep_result_ms=60_000, max_attempts=1)
    def boom() -> int:
        raise ValueError("no")

    return app, square, total, boom


def test_app_flow_wait_returns_the_roots_result(url: str, qname: str) -> None:
    from echomq.testing import drain

    app, square, total, boom = _flow_app(url, qname)
    try:
        added = app.flow(total.s(), children=[square.s(2), square.s(3)])
        failing = app.flow(total.s(), children=[boom.s()])
        assert added == echomq.FlowAdded(added.parent_id, added.child_ids)
        with pytest.raises(TimeoutError):
            added.wait(timeout_s=0.05)
        drain(app, timeout_s=20, beat_ms=20)
        assert added.wait(timeout_s=5) == 13
        with pytest.raises(echomq.JobFailed, match="failed"):
            failing.wait(timeout_s=5)
    finally:
        app.close()


async def test_app_flow_await_result(url: str, qname: str) -> None:
    from echomq.testing import adrain

    app, square, total, _ = _flow_app(url, qname)
    try:
        added = app.flow(total.s(), children=[square.s(4)])
        await adrain(app, timeout_s=20, beat_ms=20)
        assert await added.await_result(timeout_s=5) == 16
    finally:
        await app.aclose()
        app.close()
