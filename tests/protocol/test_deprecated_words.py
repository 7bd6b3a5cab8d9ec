"""Old spellings still work and warn (issue 38): the lane verbs' ``g=`` (now ``lane=``),
``browse("schedule")`` (now ``"scheduled"``, the state's name) and ``drain``'s
``include_schedule=`` (now ``include_scheduled=``).

Each deprecated spelling is tried on Queue and AsyncQueue (``anyq``) and on both executors:
the call warns with a ``DeprecationWarning`` naming the new spelling, and does what the new
spelling does (read back through the new spelling or the wire).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest
import redis

import echomq
from echomq import keyspace
from echomq.client.renamed import renamed
from echomq.errors import InvalidId

pytestmark = pytest.mark.executors

LA, LB = "la", "lb"
LANE_VERBS = (
    "pause_lane",
    "resume_lane",
    "limit_lane",
    "weight_lane",
    "reassign",
    "lane_depth",
    "rate_limit_lane",
    "clear_rate_limit",
    "rate_limit_ttl",
)


def old(match: str = r"pass lane=\.\.\. instead") -> Any:
    return pytest.warns(DeprecationWarning, match=match)


def test_the_lane_verbs_take_lane_and_no_longer_show_g() -> None:
    for cls in (echomq.Queue, echomq.AsyncQueue):
        for verb in LANE_VERBS:
            params = inspect.signature(getattr(cls, verb)).parameters
            assert "lane" in params and "g" not in params, (cls.__name__, verb)
        for verb in LANE_VERBS:  # still what they were: coroutine functions on AsyncQueue
            assert inspect.iscoroutinefunction(getattr(cls, verb)) == (cls is echomq.AsyncQueue)


def test_pause_and_resume_lane_by_g(anyq: Any) -> None:
    job = anyq.enqueue(b"x", group=LA).id
    with old():
        anyq.pause_lane(g=LA)
    assert anyq.claim() is None  # the only job waits in the paused lane
    with old():
        anyq.resume_lane(g=LA)
    assert anyq.claim().id == job


def test_limit_lane_by_g(anyq: Any) -> None:
    first = anyq.enqueue(b"x", group=LA).id
    anyq.enqueue(b"y", group=LA)
    with old():
        anyq.limit_lane(g=LA, n=1)
    assert anyq.claim().id == first
    assert anyq.claim() is None  # the lane's one slot is taken


def test_weight_lane_by_g(anyq: Any, r: redis.Redis, qname: str) -> None:
    with old():
        anyq.weight_lane(g=LA, w=3)
    assert r.hget(keyspace.queue_key(qname, "gweight"), LA) == b"3"


def test_reassign_and_lane_depth_by_g(anyq: Any) -> None:
    job = anyq.enqueue(b"x", group=LA).id
    with old():
        assert anyq.reassign(job, g=LB) == "reassigned"
    with old():
        assert anyq.lane_depth(g=LB) == 1
    assert anyq.lane_depth(LA) == 0


def test_rate_limits_by_g(anyq: Any) -> None:
    anyq.enqueue(b"x", group=LA)
    anyq.enqueue(b"y", group=LA)
    with old():
        anyq.rate_limit_lane(g=LA, max=1, window_ms=3_600_000)  # an hour: never reopens here
    assert anyq.claim() is not None
    assert anyq.claim() is None  # the lane's window is spent
    with old():
        assert anyq.rate_limit_ttl(g=LA) > 0
    with old():
        anyq.clear_rate_limit(g=LA)
    assert anyq.rate_limit_ttl(lane=LA) == 0
    assert anyq.claim() is not None


def test_the_old_spelling_reaches_the_same_validation(anyq: Any) -> None:
    with old(), pytest.raises(InvalidId):
        anyq.pause_lane(g="a b")


def test_both_spellings_at_once_is_a_type_error_and_writes_nothing(anyq: Any) -> None:
    with pytest.raises(TypeError, match="both g= and lane="):
        anyq.pause_lane(g=LA, lane=LB)
    assert anyq.lanes() == []


def test_the_new_spelling_by_keyword_does_not_warn(anyq: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        anyq.pause_lane(lane=LA)
        anyq.resume_lane(lane=LA)
        assert anyq.lane_depth(lane=LA) == 0


def test_the_warning_points_at_the_caller(q: echomq.Queue) -> None:
    with old() as seen:
        q.lane_depth(g=LA)
    assert [w.filename for w in seen] == [__file__]


async def test_the_async_warning_points_at_the_awaiting_caller(aq: echomq.AsyncQueue) -> None:
    with old() as seen:
        await aq.lane_depth(g=LA)
    assert [w.filename for w in seen] == [__file__]


def test_browse_schedule_is_a_deprecated_alias_of_scheduled(anyq: Any) -> None:
    later = anyq.enqueue(b"x", delay_ms=3_600_000).id
    assert anyq.job_state(later) == "scheduled"
    assert anyq.browse("scheduled") == [later]
    with pytest.warns(DeprecationWarning, match="pass state='scheduled' instead"):
        assert anyq.browse("schedule") == [later]


def test_drain_include_schedule_is_a_deprecated_spelling(anyq: Any) -> None:
    anyq.enqueue(b"x", delay_ms=3_600_000)
    anyq.enqueue(b"y")
    with pytest.warns(DeprecationWarning, match=r"pass include_scheduled=\.\.\. instead"):
        assert anyq.drain(include_schedule=True) == 2  # the scheduled job went too
    assert anyq.browse("scheduled") == []


def test_drain_include_scheduled_keeps_its_meaning(anyq: Any) -> None:
    anyq.enqueue(b"x", delay_ms=3_600_000)
    anyq.enqueue(b"y")
    assert anyq.drain() == 1
    assert anyq.drain(include_scheduled=True) == 1


def test_renamed_keeps_a_plain_function_plain() -> None:
    @renamed(old_name="new_name")
    def f(new_name: int) -> int:
        return new_name * 2

    assert not inspect.iscoroutinefunction(f)
    assert list(inspect.signature(f).parameters) == ["new_name"]
    with pytest.warns(DeprecationWarning, match=r"f\(old_name=\.\.\.\) is deprecated"):
        assert f(old_name=2) == 4
