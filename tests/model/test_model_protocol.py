"""The protocol core's fixed chains, replayed through the one model (issue 38, item 5).

These were the scenarios of tests/protocol/test_stateful.py (deleted), the second protocol
model, whose remaining checks now live in tests/model (its verbs in verbs.py, its forged tokens,
promote limits, shared batch deadlines and raw-key checks in the machine). Each runs
through ``ModelMachine`` with the server checked against the model after every step, on
both executors: a reaped lease settled by its holder, a lapsed holder fenced by the next
claim, a released lease refused after promote / delay(0) / reprocess, duplicate pairs in one
batch, a dead lane job reprocessed into its lane, reassign, the stall ceiling, and a stale
token against a re-admitted id.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from model.core import LONG, SHORT
from model.test_model import (  # noqa: F401  (module_server, session_url: the servers)
    ModelMachine,
    Steps,
    machine_on,
    module_server,
    session_url,
)

pytestmark = pytest.mark.executors

ENQ = {"delay": None, "did": None, "mode": "simple"}


@pytest.fixture
def sm(redis_url: str, executor: str) -> Iterator[ModelMachine]:
    yield from machine_on(redis_url, executor)


def settle(s: Steps, n: int, verb: str, ms: int = 0, max_attempts: int = 3) -> None:
    s.settle(n=n, verb=verb, ms=ms, max_attempts=max_attempts, keep=False, error="boom")


def lapsed_then_claimed(s: Steps, payload: bytes) -> None:
    """A job whose first lease lapsed and was reaped, claimed again: tokens 1 and 2."""
    s.enqueue(qi=0, payload=payload, group=None, **ENQ)
    s.claim(qi=0, lease=SHORT)
    s.reap(qi=0)
    s.claim(qi=0, lease=LONG)


def one(sm: ModelMachine, state: str) -> str:
    [jid] = sm.live(0, state)
    return jid


@pytest.mark.parametrize("group", [None, "lb"])
@pytest.mark.parametrize("verb", ["complete", "retry", "delay", "extend"])
def test_a_reaped_lease_settles_once_by_its_holder(
    sm: ModelMachine, verb: str, group: str | None
) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"x", group=group, **ENQ)
    s.claim(qi=0, lease=SHORT)
    s.reap(qi=0)
    jid = one(sm, "pending")
    assert sm.m(0).jobs[jid].epoch == 1
    settle(s, 0, verb)  # the holder's token still owns the reaped, unclaimed job (D5) ...
    before = sm.m(0).counts()
    settle(s, 0, "complete" if verb == "extend" else verb)  # ... once
    if verb != "extend":
        assert sm.m(0).counts() == before


def test_a_new_claim_fences_the_lapsed_holder(sm: ModelMachine) -> None:
    s = Steps(sm)
    lapsed_then_claimed(s, b"x")
    assert [tok for _, _, tok in sm.tickets] == [1, 2]
    for verb in ("complete", "retry", "delay", "extend"):
        settle(s, 1, verb)  # token 1: stale
    assert one(sm, "active")
    settle(s, 0, "complete")
    assert sm.m(0).completed == 1


@pytest.mark.parametrize("group", [None, "lb"])
def test_a_released_lease_never_settles_again(sm: ModelMachine, group: str | None) -> None:
    """retry -> promote, delay(0) and dead -> reprocess bring the job back to waiting with
    its old attempts; the old token must not settle it (D13)."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"x", group=group, **ENQ)
    jid = sorted(sm.m(0).jobs)[0]
    s.claim(qi=0, lease=LONG)
    settle(s, 0, "retry")
    s.promote(qi=0)
    settle(s, 0, "complete")  # refused: lease settled
    s.claim_batch(qi=0, n=3, lease=LONG)
    settle(s, 0, "delay")
    settle(s, 0, "extend", ms=SHORT)  # refused: lease settled
    s.claim(qi=0, lease=LONG)
    settle(s, 0, "retry", max_attempts=1)
    assert sm.m(0).jobs[jid].state == "dead"
    s.do_reprocess(qi=0, jid=jid)
    settle(s, 0, "complete")  # refused: lease settled
    assert [(j, t) for _, j, t in sm.tickets] == [(jid, 1), (jid, 2), (jid, 3)]
    assert sm.m(0).jobs[jid].state == "pending" and sm.m(0).completed == 0


def test_duplicate_pairs_in_one_batch_are_fenced_in_order(sm: ModelMachine) -> None:
    s = Steps(sm)
    # The same id with a stale and then the current token: the second completes it.
    lapsed_then_claimed(s, b"x")
    s.settle_batch(qi=0, done=[0, 1, 0], again=[], n=0, lease=LONG, delay=0, max_attempts=1)
    assert sm.m(0).completed == 1
    lapsed_then_claimed(s, b"y")
    s.complete_many(qi=0, picks=[2, 3, 3])  # stale, current, then settled
    assert sm.m(0).completed == 2


def test_a_dead_lane_job_reprocesses_into_its_lane(sm: ModelMachine) -> None:
    s = Steps(sm)
    for g in ("la", "la", "lb", "lb"):
        s.enqueue(qi=0, payload=b"l", group=g, **ENQ)
    s.admin(qi=0, what="limit lane", g="la", n=1)
    s.claim_batch(qi=0, n=6, lease=LONG)  # la gives one job (its limit), lb two
    la = [t for t in sm.tickets if sm.m(0).jobs[t[1]].group == "la"]
    assert len(sm.tickets) == 3 and len(la) == 1
    settle(s, sm.tickets[::-1].index(la[0]), "retry", max_attempts=1)
    jid = la[0][1]
    assert sm.m(0).jobs[jid].state == "dead"
    s.do_reprocess(qi=0, jid=jid)
    assert sm.m(0).jobs[jid].state == "pending" and sm.m(0).lanes() == ["la"]
    s.claim_batch(qi=0, n=6, lease=LONG)  # the lane's slot is free again: its oldest job
    assert sm.tickets[3:] == [(0, jid, 2)]


def test_reassign_moves_waiting_and_scheduled_jobs(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue_prioritized(qi=0, payload=b"w", group="la", delay=None, priority=3)
    s.enqueue(qi=0, payload=b"s", group="la", **{**ENQ, "delay": SHORT})
    s.enqueue(qi=0, payload=b"f", group=None, **ENQ)
    waiting, later, flat = sorted(sm.m(0).jobs)
    s.do_reassign(qi=0, jid=waiting, g="lb")  # its priority comes along (D23)
    s.do_reassign(qi=0, jid=later, g="la")  # noop: already there
    s.do_reassign(qi=0, jid=later, g="lb")
    s.do_reassign(qi=0, jid=flat, g="la")
    assert sm.m(0).lanes() == ["la", "lb"]
    s.promote(qi=0)
    assert sm.m(0).jobs[later].group == "lb" and sm.m(0).jobs[later].state == "pending"
    s.claim_batch(qi=0, n=1, lease=LONG)
    s.do_reassign(qi=0, jid=sm.tickets[0][1], g="la" if sm.tickets[0][1] != flat else "lb")
    s.remove_id(qi=0, jid=later)
    s.do_reassign(qi=0, jid=later, g="la")  # gone


def test_stalls_are_counted_to_the_ceiling(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, **ENQ)
    s.enqueue(qi=0, payload=b"b", group="la", **ENQ)
    s.claim_batch(qi=0, n=4, lease=SHORT)
    s.sweep_stalled(qi=0, max_stalled=2)
    assert sm.m(0).counts()["pending"] == 2
    s.claim_batch(qi=0, n=4, lease=SHORT)
    s.sweep_stalled(qi=0, max_stalled=2)
    assert sm.m(0).counts()["dead"] == 2 and sm.m(0).failed == 2
    assert all(j.last_error == "stalled" and j.stalled == 2 for j in sm.m(0).jobs.values())


def test_a_stale_token_never_settles_a_readmitted_id(sm: ModelMachine) -> None:
    """Issue 10 #1 through the model: the first incarnation's token 1 must not settle the
    second, whose first claim now mints 2."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"v1", group=None, **ENQ)
    jid = sorted(sm.m(0).jobs)[0]
    s.claim(qi=0, lease=LONG)
    s.remove_id(qi=0, jid=jid)
    sm.admit_one(0, jid, b"v2", None, None, None, "simple")
    sm.server_agrees_with_model()
    s.claim(qi=0, lease=LONG)
    assert [t for _, _, t in sm.tickets] == [1, 2]
    for verb in ("complete", "retry", "delay", "extend"):
        settle(s, 1, verb, max_attempts=1)  # the old holder: refused
    assert sm.m(0).jobs[jid].state == "active" and sm.m(0).counts()["dead"] == 0
    settle(s, 0, "complete")
    assert sm.m(0).completed == 1 and sm.m(0).retired == {jid: 2}


def test_a_reprocess_clears_progress_and_keeps_logs_and_errors(sm: ModelMachine) -> None:
    """PROTOCOL §2.4: `:logs` and `:errors` are the history of every run; `progress` is the
    run's own and a reprocess clears it."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"p", group=None, **ENQ)
    s.annotate(qi=0, n=1, what="log", keep=0)
    s.claim(qi=0, lease=LONG)
    s.annotate(qi=0, n=1, what="progress", keep=0)
    settle(s, 0, "retry", max_attempts=1)  # dead: `:errors` holds "attempt 1: boom"
    s.annotate(qi=0, n=2, what="log", keep=1)  # keep 1: only the newest line
    s.reprocess(qi=0, n=1)
    jid = one(sm, "pending")
    assert sm.m(0).jobs[jid].progress is None and sm.m(0).jobs[jid].logs == ["log2"]
    assert sm.m(0).jobs[jid].errors == ["attempt 1: boom"]


def test_the_read_plane_agrees_under_spent_rate_windows(sm: ModelMachine) -> None:
    """look: rate_limit_ttl of a spent window (queue-wide and a lane's), browse and the raw
    checker while a spent lane is out of the ring."""
    s = Steps(sm)
    s.admin(qi=0, what="rate lane", g="la", n=1)
    s.admin(qi=0, what="rate", g="la", n=2)
    for g in ("la", "la", None, "lb"):
        s.enqueue(qi=0, payload=b"r", group=g, **ENQ)
    s.claim_batch(qi=0, n=4, lease=LONG)  # two claims in all, one of them from la
    assert sm.m(0).rate == (2, 2) and sm.m(0).lane_rate["la"] == (1, 1)
    s.look(qi=0, n=0)
