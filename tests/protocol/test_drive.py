"""The one plan driver (:class:`echomq.client.drive.Drive`, issue 38) without a server: what it asks
the caller to send next, and what it does with a result or a lost reply. Every executor (sync,
asyncio, the autopipe, a plan resumed after its first step) only sends what it holds.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from echomq.client.connect import Budget
from echomq.client.drive import Drive
from echomq.errors import ServerUnreachable
from echomq.protocol.kernel import Call, Plan, _resent

LOST = RedisConnectionError("the reply was lost")


def _call(name: str, replay: bool = False) -> Call[Any]:
    return Call(None, (), (name,), lambda r: r, replay)


def _two_steps() -> Plan[tuple[Any, Any]]:
    first = yield _call("one")
    second = yield from _resent(_call("two"))  # resent after a lost reply
    return first, second


def test_results_feed_the_plan_to_its_value() -> None:
    d = Drive(_two_steps(), Budget(5.0))
    assert isinstance(d.step, Call) and d.step.args == ("one",) and not d.done
    d.ok(1)
    assert isinstance(d.step, Call) and d.step.args == ("two",)
    d.ok(2)
    assert d.done and d.value == (1, 2)


def test_a_lost_reply_is_thrown_into_the_plan_which_may_resend() -> None:
    d = Drive(_two_steps(), Budget(5.0))
    d.ok(1)
    assert d.delay(LOST, None) > 0  # within retry_for: a backoff sleep
    d.lost(LOST)  # _resent catches the Replay and yields its call again
    assert isinstance(d.step, Call) and d.step.args == ("two",) and not d.done
    d.ok(2)
    assert d.done and d.value == (1, 2)


def test_a_plan_that_lets_replay_through_raises_the_lost_reply() -> None:
    d = Drive(_two_steps(), Budget(5.0))  # its first step is not resent
    with pytest.raises(RedisConnectionError) as caught:
        d.lost(LOST)
    assert caught.value is LOST


def test_a_replay_safe_pipeline_is_resent_as_it_is() -> None:
    def reads() -> Plan[list[Any]]:
        got: list[Any] = yield [_call("a", True), _call("b", True)]
        return got

    d = Drive(reads(), Budget(5.0))
    step = d.step
    d.lost(LOST)  # not thrown into the plan (it would not catch it): the same step again
    assert d.step is step and not d.done
    d.ok(["x", "y"])
    assert d.value == ["x", "y"]
    # At the plan's deadline the plan decides: the Replay is thrown (and here raises).
    late = Drive(reads(), Budget(5.0, deadline=time.monotonic() - 1))
    assert late.delay(LOST, None) == 0.0
    with pytest.raises(RedisConnectionError):
        late.lost(LOST)


def test_a_resumed_plan_gets_the_reply_and_its_own_replay() -> None:
    """A plan whose first step went out in another pipeline (the worker's beat): the reply is
    sent in, and a later lost reply is thrown into the plan itself, which resends. (The hand
    driver it replaces, ``runtime.queueloop._resume``, wrapped the plan: the Replay stopped at the
    wrapper and the beat raised instead.)"""
    plan = _two_steps()
    next(plan)  # its first call was sent elsewhere
    d = Drive(plan, Budget(5.0), 1)
    assert isinstance(d.step, Call) and d.step.args == ("two",)
    d.lost(LOST)
    assert isinstance(d.step, Call) and d.step.args == ("two",) and not d.done
    d.ok(2)
    assert d.value == (1, 2)


def test_a_spent_budget_gives_up() -> None:
    d = Drive(_two_steps(), Budget(0.0))
    with pytest.raises(ServerUnreachable) as caught:
        d.delay(LOST, None)
    assert caught.value.__cause__ is LOST


def test_a_plan_done_before_any_step() -> None:
    def nothing() -> Plan[int]:
        return 7
        yield _call("never")  # pragma: no cover - makes it a generator

    d = Drive(nothing(), Budget(5.0))
    assert d.done and d.value == 7
    # A plan resumed with its last reply ends there too.
    plan = _two_steps()
    next(plan)
    plan.send(1)
    assert Drive(plan, Budget(5.0), 2).value == (1, 2)
