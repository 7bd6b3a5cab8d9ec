"""The fixed scenarios of the reference model: seam chains of issues 22, 24 and 37 replayed
through ModelMachine (test_model.py), every step checked against the model, so each runs on
every CI run whatever hypothesis draws.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import echomq
from model.core import LONG, SHORT
from model.draws import DIDS
from model.test_model import (  # noqa: F401  (module_server, session_url: the servers)
    ModelMachine,
    Steps,
    live_pick,
    machine_on,
    module_server,
    session_url,
    waive,
)

pytestmark = pytest.mark.executors


@pytest.fixture
def sm(redis_url: str, executor: str) -> Iterator[ModelMachine]:
    yield from machine_on(redis_url, executor)


@pytest.mark.parametrize("cross", [0, 1])
def test_a_reprocessed_child_counts_once(sm: ModelMachine, cross: int) -> None:
    """#1: an ignored child's death, then its reprocess and completion, count once: the
    parent waits for its other child."""
    s = Steps(sm)
    s.admin(qi=0, what="pause lane", g="la", n=None)  # holds the other child back
    # root on queue 0; children: an ignored one (maybe on queue 1) and one in lane la.
    s.add_flow(qi=0, shape=[(2, True, 0, None), (0, False, cross, None), (0, True, 0, "la")])
    root = next(iter(sm.m(0).flows))
    ignored: tuple[int, str] | None = None
    other: tuple[int, str] | None = None
    for qi in (0, 1):
        for jid, j in sm.m(qi).jobs.items():
            if j.parent == root and j.policy == "id":
                ignored = (qi, jid)
            elif j.parent == root:
                other = (qi, jid)
    assert ignored and other
    qi = ignored[0]
    s.work(qi=qi, outcomes=["die"])  # the flat set first: the ignored child
    if cross:
        s.pump(qi=1)
    s.reprocess(qi=qi, n=1)
    s.work(qi=qi, outcomes=["done"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "awaiting_children"


@pytest.mark.parametrize("cross", [0, 1])
def test_a_chain_stops_at_its_dead_step(sm: ModelMachine, cross: int) -> None:
    """Issue 42: a chain of three steps (a nested flow, one child per level, the middle step
    maybe on the other queue): the first completes and releases the second; the second dies
    and kills the last (never claimable); then its reprocess and completion release nothing
    (the last step is dead already)."""
    s = Steps(sm)
    s.add_chain(qi=0, steps=3, cross=[0, cross, cross, 0, 0], lane=None)
    root = next(iter(sm.m(0).flows))
    s.work(qi=0, outcomes=["done+keep"])  # the first step (on queue 0 with cross: 0 ^ 1 ^ 1)
    middle = 1 if cross else 0
    if cross:
        s.pump(qi=0)
    s.work(qi=middle, outcomes=["die"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "dead"
    mid = next(jid for jid, j in sm.m(middle).jobs.items() if j.parent == root)
    s.do_reprocess(qi=middle, jid=mid)
    s.work(qi=middle, outcomes=["done"])
    if cross:
        s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "dead"


def test_a_reprocessed_job_starts_without_its_result(sm: ModelMachine) -> None:
    """#5: a re-admission or a reprocess must not read the previous incarnation's result."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    jid = sorted(sm.m(0).jobs)[0]
    s.wait(qi=0, n=0)  # leaves the want marker: the death pushes a notify token
    s.work(qi=0, outcomes=["die+keep"])
    s.wait(qi=0, n=0)  # JobFailed boom
    s.reprocess(qi=0, n=1)
    s.wait(qi=0, n=0)  # the new incarnation has not run: TimeoutError
    s.work(qi=0, outcomes=["done+keep"])
    s.enqueue_id(qi=0, n=0, payload=b"b", group=None, did=None, mode="simple")
    assert sm.m(0).jobs[jid].payload == b"b"
    s.wait(qi=0, n=0)  # re-admitted, not run: TimeoutError, not the old value


def test_a_cancel_flag_ends_with_its_run(sm: ModelMachine) -> None:
    """#4: a cancelled run's flag does not reach the next run (retry, lapse, reprocess)."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.claim(qi=0, lease=LONG)
    s.cancel(qi=0, n=1, remove=False)
    s.extend_leases(qi=0, picks=[0], lease=SHORT)  # reports the flag
    s.settle(n=0, verb="retry", ms=0, max_attempts=1, keep=False, error="cancelled")  # dead
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=SHORT)
    s.extend_leases(qi=0, picks=[0], lease=SHORT)  # a new run: nothing to report
    s.cancel(qi=0, n=1, remove=True)
    s.reap(qi=0)  # the run lapsed: the flag ends with it
    s.claim(qi=0, lease=LONG)
    s.extend_leases(qi=0, picks=[0], lease=LONG)
    s.settle(n=0, verb="retry", ms=0, max_attempts=1, keep=False, error="cancelled")


def test_wait_on_a_dead_job_fails_at_once(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["die"])  # no kept result: the row says dead
    s.wait(qi=0, n=0)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["die"])  # the fail_parent child kills its parent
    for n in range(3):
        s.wait(qi=0, n=n)


def test_dedup_and_duplicate_refusals(sm: ModelMachine) -> None:
    s = Steps(sm)
    for did in DIDS:
        s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=did, mode="simple")
        s.enqueue(qi=0, payload=b"b", group=None, delay=None, did=did, mode="simple")
    s.enqueue_id(qi=0, n=0, payload=b"c", group=None, did=None, mode="simple")


def test_a_removed_parent_is_told_nothing(sm: ModelMachine) -> None:
    """remove x flows: a child settling after its parent was removed writes no key of it."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(2, True, 0, None), (0, False, 0, None), (0, True, 0, None)])
    root = next(iter(sm.m(0).flows))
    s.remove(qi=0, n=live_pick(sm, 0, root))
    assert root not in sm.m(0).jobs
    s.work(qi=0, outcomes=["done", "die"])


def test_a_reaped_holder_and_its_debounce(
    sm: ModelMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reap x dedup: a debounce that finds its holder reaped (pending, its lease still
    open) must not hand the new payload to the old holder's settle."""
    waive(monkeypatch, "events")
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"v1", group=None, delay=None, did="d1", mode="debounce")
    s.claim(qi=0, lease=SHORT)
    s.reap(qi=0)
    s.enqueue(qi=0, payload=b"v2", group=None, delay=None, did="d1", mode="debounce")
    s.settle(n=0, verb="complete", ms=0, max_attempts=1, keep=False, error="boom")


@pytest.mark.parametrize("how", ["drain", "cancel"])
def test_a_released_parent_drained_or_cancelled_leaves_nothing(sm: ModelMachine, how: str) -> None:
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    root = next(iter(sm.m(0).flows))
    s.work(qi=0, outcomes=["done+keep"])
    assert sm.m(0).jobs[root].state == "pending"
    if how == "drain":
        s.drain(qi=0, include_schedule=False)
    else:
        s.cancel(qi=0, n=live_pick(sm, 0, root), remove=False)
    assert root not in sm.m(0).jobs


@pytest.mark.parametrize("sweep", ["reap", "sweep_stalled"])
def test_a_sweep_that_releases_a_parent_keeps_the_flat_set_served(
    sm: ModelMachine, sweep: str
) -> None:
    """FINDINGS F12: a lapsed job parked by a sweep and a parent released by the same sweep
    (its last child's cancelled run removed) must both be claimable."""
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple")
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.claim_batch(qi=0, n=2, lease=SHORT)
    child = next(j for j, row in sm.m(0).jobs.items() if row.parent)
    sm.do_cancel(0, child, True)
    sm.server_agrees_with_model()
    if sweep == "reap":
        s.reap(qi=0)
    else:
        s.sweep_stalled(qi=0, max_stalled=2)
    s.claim_batch(qi=0, n=3, lease=LONG)  # the flat job and the released parent


@pytest.mark.parametrize("end", ["complete", "remove"])
def test_an_old_child_never_settles_into_a_new_incarnation(sm: ModelMachine, end: str) -> None:
    """FINDINGS F13: the parent's id removed and admitted again as an unrelated job; its old
    child's completion (or removal) must not count down the new row."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "la")])
    root = next(iter(sm.m(0).flows))
    child = next(j for j, row in sm.m(0).jobs.items() if row.parent == root)
    s.remove(qi=0, n=live_pick(sm, 0, root))
    sm.admit_one(0, root, b"a new job", "lb", None, None, "simple")
    sm.server_agrees_with_model()
    if end == "remove":
        s.remove(qi=0, n=live_pick(sm, 0, child))
    else:
        tok = sm.claim_only(0, LONG, {child})[child]
        sm.do_complete(0, child, tok, False, b"R")
        sm.server_agrees_with_model()


# ---------------------------------------------------------------------- issue 24 scenarios
# Priorities and the queue-wide limit, replayed through the machine (every step checked
# against the model), so each runs on every CI run whatever hypothesis draws.


def test_priorities_order_claims_and_survive_every_return(sm: ModelMachine) -> None:
    s = Steps(sm)
    for p in (5, 1, 2**21, 0, 1):
        s.enqueue_prioritized(qi=0, payload=b"f", group=None, delay=None, priority=p)
    s.enqueue_prioritized(qi=0, payload=b"l", group="la", delay=None, priority=3)
    s.enqueue_prioritized(qi=0, payload=b"s", group=None, delay=SHORT, priority=2)
    s.claim_batch(qi=0, n=3, lease=SHORT)  # take() checks each is the head of its set
    s.reap(qi=0)  # back to waiting with their priorities
    s.work(qi=0, outcomes=["fail", "die", "hold"])  # retried, dead, held
    s.promote(qi=0)
    m = sm.m(0)
    dead = next(i for i, j in m.jobs.items() if j.state == "dead")
    s.reprocess(qi=0, n=live_pick(sm, 0, dead))
    assert m.jobs[dead].priority != 0 or m.jobs[dead].state == "pending"
    for state in ("active", "pending", "scheduled"):
        for jid in [i for i, j in m.jobs.items() if j.state == state][:1]:
            s.change_priority(qi=0, n=sorted(m.seen).index(jid), priority=7)
    s.claim_batch(qi=0, n=5, lease=LONG)


def test_the_queue_limit_caps_every_claim_path(sm: ModelMachine) -> None:
    s = Steps(sm)
    for g in (None, "la", "lb", None):
        s.enqueue_prioritized(qi=0, payload=b"x", group=g, delay=None, priority=0)
    s.limit_queue(qi=0, n=2)
    s.claim(qi=0, lease=LONG)
    s.claim_batch(qi=0, n=5, lease=LONG)  # the room left: one
    s.claim(qi=0, lease=LONG)  # empty at the limit
    s.work(qi=0, outcomes=["done"])  # nothing claimable: nothing done
    s.limit_queue(qi=0, n=3)
    s.work(qi=0, outcomes=["done", "done"])  # one slot: one claimed, completed
    s.limit_queue(qi=0, n=None)
    s.claim_batch(qi=0, n=5, lease=LONG)
    assert sm.m(0).active_count() == 3  # four jobs, one completed


# ---------------------------------------------------------------------- kept history (issue 24)
# keep_completed / keep_dead by count (the age bound reads the server clock: it is driven
# in tests/features/test_kept_history.py), the completed state, reprocess of a kept
# completed job with and without a delay, re-admission, remove and cancel of a kept row;
# every step checked.


def test_kept_completed_rows_trim_by_count_and_rerun(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.admin(qi=0, what="keep", g="la", n=2)
    for i in range(4):
        s.enqueue(qi=0, payload=b"k%d" % i, group=None, delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["done", "done+keep", "done", "done+keep"])  # trims to 2
    kept = sm.live(0, "completed")
    assert len(kept) == 2
    s.enqueue_id(qi=0, n=1, payload=b"x", group=None, did=None, mode="simple")  # a duplicate
    s.do_reprocess(qi=0, jid=kept[0], delay=LONG)  # a kept completed job, later
    assert sm.m(0).jobs[kept[0]].state == "scheduled"
    s.do_reprocess(qi=0, jid=kept[1])  # and now
    assert sm.m(0).jobs[kept[1]].state == "pending"
    s.admin(qi=0, what="keep", g="la", n=1)  # a lower bound: the next completion trims
    s.work(qi=0, outcomes=["done"])
    assert len(sm.live(0, "completed")) == 1
    s.do_cancel(qi=0, jid=sm.live(0, "completed")[0], remove=False)  # absent: nothing runs
    s.remove_id(qi=0, jid=sm.live(0, "completed")[0])
    s.admin(qi=0, what="keep", g="la", n=None)  # off: completions delete again
    s.work(qi=0, outcomes=["done", "done"])


def test_kept_dead_rows_trim_by_count(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.admin(qi=0, what="keep dead", g="la", n=1)
    for i in range(3):
        s.enqueue(qi=0, payload=b"d%d" % i, group="la", delay=None, did=None, mode="simple")
    s.work(qi=0, outcomes=["die", "die+keep", "hold"])
    assert len(sm.live(0, "dead")) == 1
    s.claim(qi=0, lease=SHORT)
    s.sweep_stalled(qi=0, max_stalled=1)  # a stall death trims too
    assert len(sm.live(0, "dead")) == 1
    s.do_reprocess(qi=0, jid=sm.live(0, "dead")[0], delay=SHORT)
    s.pump(qi=0)  # due: promoted back to waiting
    s.admin(qi=0, what="keep dead", g="la", n=None)


def test_a_kept_flow_parent_and_its_rerun_child(sm: ModelMachine) -> None:
    """A kept parent keeps its children's outcomes; a kept child reprocessed and completed
    again moves its record, never counts twice."""
    s = Steps(sm)
    s.admin(qi=0, what="keep", g="la", n=2)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["done+keep"])  # the child
    s.work(qi=0, outcomes=["done"])  # the parent
    child = next(i for i, j in sm.m(0).jobs.items() if j.parent is not None)
    assert sm.m(0).jobs[child].state == "completed"
    s.do_reprocess(qi=0, jid=child)
    s.work(qi=0, outcomes=["done"])


def test_a_kept_child_rerun_that_dies_moves_its_record(sm: ModelMachine) -> None:
    """Found by the machine (deep run): a flow child that completed and was kept (issue 24)
    is reprocessed and its new run dies, ignored: its record moves from processed to
    unsuccessful (its latest outcome, PROTOCOL §2.4), still counted once."""
    s = Steps(sm)
    s.keep_history(keep=1, dead=None)
    s.seed(n=0, g=None)
    s.drain(include_schedule=False, qi=0)
    s.flow_seam(chain="child-rerun", cross=0)
    s.reprocess(delay=None, n=1, qi=0)
    s.settle_batch(again=[], delay=0, done=[], lease=20, max_attempts=1, n=0, qi=0)
    s.flow_seam(chain="debounce-lapse", cross=0)
    s.seam(chain="cancel-retry", keep=False, qi=0, remove=False)


def test_a_batch_trims_its_kept_rows_after_its_verdicts(sm: ModelMachine) -> None:
    """Found by the machine (FINDINGS F20): a batch that completes an active job and, again,
    a job completed and kept earlier, with keep_completed 1. The script answers every
    complete first and trims once after (the earlier row still there: StaleToken, "lease
    settled"); the model trimmed after each completion and expected JobGone."""
    s = Steps(sm)
    s.keep_history(keep=1, dead=None)
    s.seed(n=3, g=None)
    s.reschedule(due=False, n=0, qi=0)
    s.fire_due(qi=0)
    s.settle_batch(again=[], delay=0, done=[], lease=20, max_attempts=1, n=3, qi=0)
    s.settle(error="boom", keep=False, max_attempts=1, ms=0, n=0, verb="complete")
    s.settle_batch(again=[], delay=0, done=[0, 2], lease=20, max_attempts=1, n=0, qi=0)


def test_an_expiry_a_seam_claim_meets_dies_before_the_seam_goes_on(sm: ModelMachine) -> None:
    """Found by the machine (deep run): a claim inside a multi-step rule dead-letters the
    expired job it meets at once, so a bounded dead set trims it in time order with the
    deaths that follow in the same rule; the model learnt of the expiry only at its next
    check, after the rule, and trimmed the wrong job."""
    s = Steps(sm)
    s.seed(n=0, g=None)
    s.keep_history(keep=None, dead=2)
    s.flow_seam(chain="child-rerun", cross=0)
    s.seam(chain="cancel-retry", keep=False, qi=0, remove=False)
    s.enqueue_prioritized(delay=None, group=None, payload=b"", priority=0, qi=0, ttl=1)
    s.flow_seam(chain="child-rerun", cross=0)


def test_kept_dead_trims_by_the_time_of_death_not_the_last_lease(sm: ModelMachine) -> None:
    """Found by the machine: a claimed job that dies and a never-claimed flow parent killed by
    its child are ordered by their time of death in the dead set (D25), not by a past lease."""
    s = Steps(sm)
    s.admin(qi=0, what="keep dead", g="la", n=2)
    s.enqueue(qi=0, payload=b"", group=None, delay=None, did=None, mode="simple")
    s.add_flow(qi=0, shape=[(0, False, 0, None), (0, True, 0, None)])
    s.work(qi=0, outcomes=["die", "die"])
    assert len(sm.live(0, "dead")) == 2


# ---- issue 22 (i22close): a parent id re-used for a new flow ----
@pytest.mark.parametrize("cross", [0, 1])
def test_an_old_child_never_counts_toward_a_new_flow(sm: ModelMachine, cross: int) -> None:
    """The parent's id re-used for a new flow (add_flow with that id) while its old child
    lives: the old child's completion must not count toward the new parent, whose own child
    still waits."""
    s = Steps(sm)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, cross, "la")])
    root = next(iter(sm.m(0).flows))
    s.remove(qi=0, n=live_pick(sm, 0, root))
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "lb")], reuse=0)
    assert sm.m(0).jobs[root].state == "awaiting_children"
    old = next(j for j, row in sm.m(cross).jobs.items() if row.parent == root and row.group == "la")
    tok = sm.claim_only(cross, LONG, {old})[old]
    sm.do_complete(cross, old, tok, False, b"old")
    sm.server_agrees_with_model()
    s.pump(qi=1)
    assert sm.m(0).jobs[root].state == "awaiting_children"


# ---- end i22close ----
# ---------------------------------------------------------------------- issue 24 (i24ctl)
# Budgets, expiry and the small controls, replayed through the machine on every leg.


def test_an_expired_job_is_dead_lettered_and_reprocessed_without_its_ttl(
    sm: ModelMachine,
) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group="la", delay=None, did="d1", mode="simple", ttl=1)
    s.enqueue(qi=0, payload=b"b", group="la", delay=None, did=None, mode="simple", ttl=LONG)
    s.enqueue(qi=0, payload=b"c", group=None, delay=None, did=None, mode="simple", ttl=1)
    s.wait(qi=0, n=0)  # a waiter on the first job: its expiry wakes it
    s.claim_batch(qi=0, n=5, lease=LONG)  # meets both expired ones, leases "b"
    dead = sm.live(0, "dead")
    assert len(dead) == 2 and all(sm.m(0).jobs[j].last_error == "expired" for j in dead)
    assert sm.m(0).counts()["active"] == 1
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=LONG)
    assert sm.m(0).counts()["active"] == 2


def test_a_jobs_own_budget_restarts_after_reprocess(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=None, did=None, mode="simple", budget=2)
    for _ in range(2):
        s.claim(qi=0, lease=LONG)
        s.fail_with_budget(qi=0, n=0)
        sm.tick("scheduled")
        s.promote(qi=0)
    assert sm.live(0, "dead"), "two attempts of a budget of 2: dead"
    s.reprocess(qi=0, n=1)
    s.claim(qi=0, lease=LONG)
    s.fail_with_budget(qi=0, n=0)
    assert sm.live(0, "scheduled"), "a reprocess restarts the budget"


def test_controls_of_scheduled_and_waiting_jobs(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"a", group=None, delay=LONG, did=None, mode="simple", ttl=LONG)
    s.enqueue(qi=0, payload=b"b", group="lb", delay=LONG, did=None, mode="simple")
    s.enqueue(qi=0, payload=b"c", group=None, delay=None, did=None, mode="simple")
    s.reschedule(qi=0, n=1, due=True)
    s.reschedule(qi=0, n=0, due=False)  # n % 3 == 0: any id, refused unless scheduled
    s.update_payload(qi=0, n=1, payload=b"new")
    s.run_now(qi=0, n=2)
    s.promote(qi=0)
    s.cancel_all(qi=0)
    assert not sm.m(0).jobs


def test_cancel_all_signals_the_running_and_takes_a_released_parent(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.enqueue(qi=0, payload=b"run", group=None, delay=None, did=None, mode="simple")
    s.claim(qi=0, lease=LONG)
    s.add_flow(qi=0, shape=[(1, True, 0, None), (0, True, 0, "la")])
    s.cancel_all(qi=0)
    assert [j.cancel for j in sm.m(0).jobs.values()] == ["1"]


@pytest.mark.parametrize("children", [True, False])
def test_remove_a_flow_parent_with_or_without_its_children(
    sm: ModelMachine, children: bool
) -> None:
    s = Steps(sm)
    s.add_flow(
        qi=0,
        shape=[(2, True, 0, None), (2, False, 0, "la"), (0, True, 0, None), (0, True, 0, "lb")],
    )
    s.claim(qi=0, lease=LONG)  # one leaf runs on
    root = next(i for i, j in sm.m(0).jobs.items() if j.parent is None)
    s.remove_id(qi=0, jid=root, children=children)
    left = {j.state for j in sm.m(0).jobs.values()}
    assert left == ({"active"} if children else {"active", "pending", "awaiting_children"})


def test_a_repeat_limit_stops_it(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.repeat_limited(qi=0, name="r1", g=None, limit=2)
    for _ in range(3):
        s.fire_due(qi=0)
    assert sm.m(0).repeat_fired["r1"] == 2 and not sm.m(0).repeat_live("r1")
    s.repeat_limited(qi=0, name="r1", g=None, limit=2)  # the same limit: still spent
    s.repeat(qi=0, name="r1", g=None)  # no limit: fires again, the count kept
    s.fire_due(qi=0)


def test_a_paused_repeat_never_fires_and_resumes_from_now(sm: ModelMachine) -> None:
    s = Steps(sm)
    s.repeat(qi=0, name="r1", g=None)
    s.repeat_limited(qi=0, name="r2", g="la", limit=1)
    s.pause_repeat(qi=0, name="r1")
    s.fire_due(qi=0)  # only r2
    s.repeat(qi=0, name="r1", g=None)  # a worker start: still paused
    s.pause_repeat(qi=0, name="r2")  # spent and paused
    s.fire_due(qi=0)  # nothing due
    s.resume_repeat(qi=0, name="r2")  # spent: stays ended
    s.resume_repeat(qi=0, name="r1")
    s.resume_repeat(qi=0, name="r1")  # not paused: left alone
    s.fire_due(qi=0)
    s.pause_repeat(qi=0, name="r1")
    s.unrepeat(qi=0, name="r1")
    s.pause_repeat(qi=0, name="r1")  # unknown now: False, nothing written


def test_every_mutation_anchor_is_in_the_tree() -> None:
    """tests/model/mutations.py re-introduces each seam bug by exact-text edits of the fixed
    code (Lua and its C twin); a refactor that moves or respells that code must move the
    anchor with it, or the mutation check reports "anchor not found" long after."""
    from model.mutation_seams import PATCHES

    root = Path(__file__).resolve().parents[2]
    for seam, patches in PATCHES.items():
        for path, old, _new in patches:
            assert (root / path).read_text().count(old) == 1, (seam, path, old)


def test_a_repeat_limit_lowered_below_its_fires_is_no_violation(q: echomq.Queue) -> None:
    """Found by the machine (FINDINGS F27, `test_machine[lua]` during the issue-37 mutation
    check): `repeat(limit=)` keeps the fire count across an update (issue 26), so a limit
    set below it is a spent repeat, yet check() (676ec2f) reports "fired 2 times, past its
    limit 1". Fired by `fire_due` until the count is 2, however long that takes."""
    q.repeat("r2", b"x", every_ms=1, limit=2)
    deadline = time.monotonic() + 120
    fired = 0
    while fired < 2 and time.monotonic() < deadline:
        q.fire_due()
        fired = next(x.fired for x in q.repeats() if x.name == "r2")
    assert fired == 2
    assert q.check() == []
    q.repeat("r2", b"x", every_ms=1, limit=1)  # lowered below the count: now spent
    [rep] = [x for x in q.repeats() if x.name == "r2"]
    assert (rep.limit, rep.fired) == (1, 2)
    assert q.check() == []


def test_a_debounce_fold_takes_the_calls_default_priority(sm: ModelMachine) -> None:
    """Found by the machine (FINDINGS F28, `test_machine_mixed_executors` during the issue-37
    mutation check): a fold takes the newest call's priority (d069e9e), the default 0 for a
    call that names none, so a holder raised to priority 5 loses it; the model kept it."""
    s = Steps(sm)
    s.enqueue(
        budget=99, delay=60000, did="d1", group=None, mode="debounce", payload=b"a", qi=0, ttl=None
    )
    s.change_priority(n=0, priority=5, qi=0)
    s.enqueue(budget=99, delay=20, did="d1", group=None, mode="debounce", payload=b"b", qi=0, ttl=1)
