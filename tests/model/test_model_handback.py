"""The reference model (test_model.py) with the worker's shutdown hand-back among its verbs
(issue 36, item 1).

A stopping worker hands each run it still holds back with ``push_back(id, token, 0)``: the
job is pending again at once, and the run spends no attempt — the row's ``floor`` rises by
one while ``attempts`` (the fencing token claims mint) is never lowered. ``HandbackMachine``
is ``ModelMachine`` plus that verb, drawn among all the others (complete, retry at the
ceiling, delay, extend, reap, the stall sweep, reprocess, re-admission of retired ids,
cancel, flows ...), so the model checks after every step that:

- a hand-back is fenced like every settle verb (a stale or gone token is refused, and a
  stale holder stays refused after the next claim);
- the row's ``floor`` is the model's (the machine compares every row field);
- each claim reports the floor (``Job.floor``), so ``Job.attempt`` = ``token - floor`` is
  the attempt number the retry ceiling counts (``attempts - floor >= max_attempts``);
- a reprocess or a re-admission starts from a fresh floor (= attempts, = the retired count),
  whatever the hand-backs of the incarnation before.

Legs: Lua and native, as test_model.py. Budget: 10 examples of up to 40 steps per leg
(``ECHOMQ_MODEL_DEEP=1``: 20x). A fixed scenario below replays the issue's story through the
same machine on every run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis.stateful import rule, run_state_machine_as_test

import echomq
from echomq.protocol import control as _ctl
from model.core import LONG, Job
from model.draws import PICK, budget, note
from model.test_model import (  # noqa: F401  (module_server, session_url: the servers)
    ModelMachine,
    Steps,
    module_server,
    session_url,
)

pytestmark = pytest.mark.executors


class HandbackMachine(ModelMachine):
    """ModelMachine plus the worker's shutdown hand-back (push_back with no delay)."""

    def take(self, qi: int, job: echomq.Job) -> Job:
        j = super().take(qi, job)
        # The claim reports the floor, so the worker's attempt number is the ceiling's.
        assert job.floor == j.floor, f"claim reported floor {job.floor}, model {j.floor}"
        assert job.attempt == job.token - j.floor
        return j

    @rule(n=PICK)
    def hand_back(self, n: int) -> None:
        """A stopping worker gives back a run it holds (current, or stale by now)."""
        t = self.ticket(n)
        if t is None:
            return
        qi, jid, token = t
        err = self.fence(qi, jid, token)
        q = self.q(qi)
        self.expect(err, q._x.run, _ctl.push_back(q._k, jid, token, 0))
        note(f"hand_back {'ok' if err is None else err.__name__}")
        if err is None:
            j = self.m(qi).jobs[jid]
            self.m(qi).leave_active(j)
            j.epoch = None
            j.state = "pending"
            j.floor += 1  # the run is not counted; attempts (the fence) stays


def run(client: redis.Redis, executors: tuple[str, ...], examples: int) -> None:
    client.script_flush()
    try:
        run_state_machine_as_test(
            lambda: HandbackMachine(client, executors), settings=budget(examples)
        )
    finally:
        client.close()


@pytest.mark.timeout(3600)
def test_handback_machine(redis_url: str, executor: str) -> None:
    run(redis.Redis.from_url(redis_url), (executor,), 10)


@pytest.fixture
def sm(redis_url: str, executor: str) -> Iterator[HandbackMachine]:
    client = redis.Redis.from_url(redis_url)
    machine = HandbackMachine(client, (executor,))
    machine.server_agrees_with_model()
    yield machine
    machine.teardown()
    client.close()


def test_two_hand_backs_then_the_ceiling(sm: HandbackMachine) -> None:
    """The issue's story through the model: two hand-backs, then real failures at
    max_attempts=2 — the first retries, the second dead-letters; a stale token of a
    handed-back run is refused all along. Every step is checked against the model."""
    s = Steps(sm)
    s.enqueue_prioritized(qi=0, payload=b"s", group=None, delay=None, priority=0, ttl=None)
    jid = sm.live(0)[0]
    for _ in range(2):
        s.claim(qi=0, lease=LONG)
        s.hand_back(n=0)
    s.claim(qi=0, lease=LONG)
    assert sm.m(0).jobs[jid].floor == 2 and sm.tickets[-1][2] == 3
    s.hand_back(n=1)  # a stale holder (token 2): refused
    s.settle(n=0, verb="retry", ms=0, max_attempts=2, keep=False, error="boom")
    assert sm.m(0).jobs[jid].state == "scheduled"
