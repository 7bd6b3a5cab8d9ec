"""The one plan driver, sans I/O: a plan's current step and what came back for it.

:class:`Drive` holds a plan's current step and answers what comes back for it, a result or
a lost reply (issue 38). Both executors (:mod:`echomq.client.executor`), the autopipe
(:mod:`echomq.client.autopipe`) and a plan resumed after its first step (the worker's beat,
:mod:`echomq.runtime.queueloop`) drive their plans through it; each keeps only its I/O:
sending the step, following a cluster, sleeping.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

from echomq.client.connect import Budget
from echomq.protocol.kernel import Call, Plan, Replay

__all__ = ["Drive"]

T = TypeVar("T")

_UNSENT: Any = object()


class Drive(Generic[T]):
    """One plan, driven without I/O. The caller sends ``step`` (a Call, or a list to
    pipeline) and reports back: :meth:`ok` with its result, or, when a
    transient error lost its reply, sleeps :meth:`delay` then calls :meth:`lost`, which
    throws ``Replay`` into the plan (the plan resends the step only if that is safe). Once
    ``done``, ``value`` is the plan's result. ``reply``: the plan is under way, its current
    step already answered with ``reply`` (it is sent into the plan here)."""

    __slots__ = ("budget", "done", "plan", "step", "value")

    def __init__(self, plan: Plan[T], budget: Budget, reply: Any = _UNSENT) -> None:
        self.plan, self.budget, self.done = plan, budget, False
        self.value: T | None = None
        self.step: Call[Any] | list[Call[Any]]
        try:
            self.step = next(plan) if reply is _UNSENT else plan.send(reply)
        except StopIteration as stop:
            self.done, self.value = True, stop.value

    def ok(self, result: Any) -> None:
        self.budget.attempt = 0  # a step went through: the next outage has its own budget
        try:
            self.step = self.plan.send(result)
        except StopIteration as stop:
            self.done, self.value = True, stop.value

    def delay(self, exc: BaseException, client: Any) -> float:
        """The sleep before a lost step is answered. At the plan's deadline none: the plan
        decides what that means (``wait()`` times out); past ``retry_for``, the budget gives
        up (raises)."""
        budget = self.budget
        delay = budget.next_delay()
        if delay is not None:
            return delay
        if budget.deadline is None or time.monotonic() < budget.deadline:
            budget.give_up(exc, client)
        return 0.0

    def lost(self, exc: BaseException) -> None:
        """The step's reply was lost to ``exc``. A pipeline whose every call is replay-safe
        (a read pipeline, say) is resent as it is, before the plan's deadline (at it the
        plan decides, as ``wait()`` does): issue 37, a read plan such as ``check()`` raised
        at the first lost connection because no plan caught the ``Replay``. Else the plan is
        thrown ``Replay``; one that lets it through raises ``exc``. (A single call rides
        out its own outage in ``call``.)"""
        step, deadline = self.step, self.budget.deadline
        if (
            isinstance(step, list)
            and all(c.replay for c in step)
            and (deadline is None or time.monotonic() < deadline)
        ):
            return  # sent again as it is
        try:
            self.step = self.plan.throw(Replay(exc))
        except Replay:
            raise exc from None
        except StopIteration as stop:
            self.done, self.value = True, stop.value
