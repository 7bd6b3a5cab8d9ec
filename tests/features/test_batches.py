"""Batches (issue 42): an open set of jobs with callbacks that each fire exactly once, on
both executors. The settling scripts decide (include/compose.lua batch_done / batch_death and
their C twins); these tests drive the queue by hand, then a fleet of worker processes.

The async producer and handler tests are in test_batches_async.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from batches_support import (
    _app,
    _drain,
    _keys,
)

import echomq
from conftest import wait_for
from echomq.tasks import batches as _batches
from procs import Spawner, wait_log

pytestmark = pytest.mark.executors


def _tag(q: echomq.Queue, job: echomq.Job) -> str:
    """The callback's tag (its first argument), from the task envelope."""
    return str(q_app_loads(job.payload)["a"][0])


def q_app_loads(payload: bytes) -> Any:
    import json

    return json.loads(payload)


def _callbacks(r: redis.Redis, seen: list[echomq.Job], ids: dict[str, str]) -> list[str]:
    names = {v: k for k, v in ids.items()}
    return sorted(names[j.id] for j in seen if j.id in names)


def _cb_ids(r: redis.Redis, q: echomq.Queue, bid: str) -> dict[str, str]:
    """The callbacks' ids: on_complete is the anchor; the others are in the anchor's fields."""
    out = {"complete": bid}
    for name in ("on_success", "on_death"):
        v = r.hget(f"emq:{{{q.name}}}:job:{bid}", name)
        if v:
            out[name[3:]] = v.split(b"\0")[0].decode()
    return out


def test_all_succeed_fires_complete_and_success_once(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(
        on_complete=t["cb"].s("complete"),
        on_success=t["cb"].s("success"),
        on_death=t["cb"].s("death"),
        description="three",
    )
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    members = b.add_many([t["member"].s(i) for i in range(3)])
    assert len(members) == 3
    st = b.status()
    assert (st.total, st.pending, st.closed, st.complete) == (3, 3, False, False)
    assert st.description == "three"
    seen = _drain(q)
    assert _callbacks(r, seen, cbs) == []  # open: nothing fires before close
    st = b.status()
    assert (st.pending, st.succeeded, st.complete) == (0, 3, False)
    assert b.close() is True
    assert b.close() is False  # a second close (or a resend) changes nothing
    st = b.status()
    assert (st.complete, st.success, st.closed) == (True, True, True)
    seen = _drain(q)
    assert _callbacks(r, seen, cbs) == ["complete", "success"]
    assert _drain(q) == []
    with pytest.raises(echomq.StateError):
        b.status()  # the anchor (on_complete) completed: the batch is gone
    assert q.check() == []
    app.close()


def test_a_death_fires_death_once_and_never_success(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(
        on_complete=t["cb"].s("complete"),
        on_success=t["cb"].s("success"),
        on_death=t["cb"].s("death"),
    )
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    members = b.add_many([t["member"].s(i) for i in range(4)])
    b.close()
    seen = _drain(q, fail={members[0], members[2]})
    assert _callbacks(r, seen, cbs) == ["complete", "death"]
    st_fired = [j.id for j in seen]
    assert st_fired.count(cbs["death"]) == 1
    assert _drain(q) == []
    # A dead member reprocessed after on_complete fired changes nothing and fires nothing.
    q.reprocess(members[0])
    assert [j.id for j in _drain(q)] == [members[0]]
    assert q.check() == []
    app.close()


def test_status_counts_and_failed_ids(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"))
    q = app.queue(qname)
    members = b.add_many([t["member"].s(i) for i in range(5)])
    _drain(q, fail=set(members[:3]))
    st = b.status(failed_limit=2)
    assert (st.total, st.succeeded, st.dead, st.pending) == (5, 2, 3, 0)
    assert len(st.failed_ids) == 2 and set(st.failed_ids) <= set(members[:3])
    assert st.first_death in members[:3]
    assert set(b.status().failed_ids) == set(members[:3])
    b.close()
    assert b.status().complete and not b.status().success
    app.close()


def test_close_before_the_last_settle_fires_in_that_settle(
    url: str, qname: str, r: redis.Redis
) -> None:
    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"), on_success=t["cb"].s("success"))
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    b.add_many([t["member"].s(i) for i in range(2)])
    b.close()
    first = q.claim()
    assert first is not None
    q.complete(first.id, first.token)
    assert b.status().complete is False
    seen = _drain(q)
    assert _callbacks(r, seen, cbs) == ["complete", "success"]
    app.close()


def test_bare_batch_ends_at_its_release(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(on_success=t["cb"].s("success"))
    q = app.queue(qname)
    b.add(t["member"].s(1))
    b.close()
    seen = _drain(q)
    assert len(seen) == 2  # the member, then on_success; no anchor job runs
    with pytest.raises(echomq.StateError):
        b.status()
    assert q.check() == []
    app.close()


def test_empty_batch_closes_straight_to_complete(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"), on_success=t["cb"].s("success"))
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    b.close()
    assert _callbacks(r, _drain(q), cbs) == ["complete", "success"]
    app.close()


def test_bad_input_is_typed_and_writes_nothing(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    other = echomq.App(url=url)

    @other.task(queue=qname + "-other", name="elsewhere")
    def elsewhere() -> None:
        return None

    before = _keys(r, qname)
    with pytest.raises(echomq.InvalidArgument):
        app.batch(on_complete="not a signature")  # type: ignore[arg-type]
    with pytest.raises(echomq.InvalidArgument):
        app.batch()  # no queue, no callback to take one from
    with pytest.raises(echomq.InvalidArgument):
        app.batch(on_complete=t["cb"].s("x"), on_death=elsewhere.s())
    with pytest.raises(echomq.InvalidArgument):
        app.batch(on_complete=t["cb"].s("x"), description=3)  # type: ignore[arg-type]
    assert _keys(r, qname) == before
    b = app.batch(on_complete=t["cb"].s("x"))
    before = _keys(r, qname)
    with pytest.raises(echomq.InvalidArgument):
        b.add("not a signature")  # type: ignore[arg-type]
    with pytest.raises(echomq.InvalidArgument):
        b.add(elsewhere.s())
    with pytest.raises(echomq.InvalidArgument):
        b.add_many([t["member"].s(1), "nope"])  # type: ignore[list-item]
    unknown = app.batch_by_id(echomq.ids.mint(), queue=qname)
    for call in (lambda: unknown.add(t["member"].s(1)), unknown.close, unknown.status):
        with pytest.raises(echomq.StateError, match="nobatch"):
            call()
    assert _keys(r, qname) == before
    b.add(t["member"].s(0))
    b.close()
    before = _keys(r, qname)
    with pytest.raises(echomq.StateError, match="closed"):
        b.add(t["member"].s(1))
    assert _keys(r, qname) == before
    _drain(app.queue(qname))  # the member, then on_complete: the batch is gone
    with pytest.raises(echomq.StateError, match="nobatch"):
        b.add(t["member"].s(1))
    b3 = app.batch(on_complete=t["cb"].s("z"))
    b3.close()  # empty: released at once, its anchor (on_complete) waits to run
    before = _keys(r, qname)
    with pytest.raises(echomq.StateError, match="finished"):
        b3.add(t["member"].s(1))
    assert _keys(r, qname) == before
    # A job that exists is not made a member: the call is refused whole.
    b2 = app.batch(on_complete=t["cb"].s("y"))
    taken = t["member"].enqueue(5).id
    before = _keys(r, qname)
    with pytest.raises(echomq.StateError, match="exists"):
        b2.add_many([t["member"].s(0), t["member"].s(1).options(id=taken)])
    assert _keys(r, qname) == before
    assert b2.status().total == 0
    app.close()
    other.close()


def test_a_lost_add_reply_resent_counts_once(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"))
    q = app.queue(qname)
    plan = _batches.add(q._k, None, b.id, [t["member"].s(1), t["member"].s(2)], "")
    call = next(plan)
    first = q._x.run(call)
    # The member completes before the resend arrives (its row is gone: only the call's
    # verdicts tell the resend it landed).
    _drain(q)
    again = q._x.run(call)
    assert [str(v) for v in first] == ["enqueued", "enqueued"]
    assert [str(v) for v in again] == ["replayed", "replayed"]
    st = b.status()
    assert (st.total, st.succeeded, st.pending) == (2, 2, 0)
    app.close()


def _fired(r: redis.Redis, qname: str) -> list[str]:
    return sorted(x.decode() for x in r.lrange(f"emqtest:{qname}:fired", 0, -1))


def _batch_app(url: str, qname: str) -> Any:
    """tests/apps/batchapp.py's tasks, bound to this test's queue."""
    app = echomq.App(url=url)

    @app.task(queue=qname, name="member", max_attempts=2, backoff=10)
    def member(n: int, fail: bool = False, spawn: int = 0) -> int:
        return n

    @app.task(queue=qname, name="fired")
    def fired(kind: str) -> None:
        return None

    return app, member, fired


def _idle(q: echomq.Queue) -> bool:
    c = q.counts()
    return c.get("pending", 0) == c.get("active", 0) == c.get("scheduled", 0) == 0


@pytest.mark.parametrize("failing", [0, 7])
def test_a_thousand_members_under_four_worker_processes(
    spawn: Spawner, url: str, qname: str, r: redis.Redis, failing: int
) -> None:
    """1,000 members settled by 4 worker processes (8 slots each): on_complete fires once;
    on_success once when all succeed; with some dying, on_death once and on_success never."""
    app, member, fired = _batch_app(url, qname)
    b = app.batch(
        on_complete=fired.s("complete"),
        on_success=fired.s("success"),
        on_death=fired.s("death"),
        description="fleet",
    )
    env = spawn.env(EMQ_TEST_QUEUE=qname)
    workers = [spawn.start("worker", "apps.batchapp:app", "-c", "8", env=env) for _ in range(4)]
    for w in workers:
        wait_log(w, "serving")
    dying = set(range(0, 1000, 1000 // failing)) if failing else set()
    for start in range(0, 1000, 250):  # adds while the workers already settle
        b.add_many([member.s(n, fail=n in dying) for n in range(start, start + 250)])
    b.close()
    want = [f"complete:{b.id}"] + ([f"death:{b.id}"] if failing else [f"success:{b.id}"])
    wait_for(lambda: len(_fired(r, qname)) >= len(want) and _idle(app.queue(qname)), 120)
    assert _fired(r, qname) == sorted(want)
    st_runs = int(r.get(f"emqtest:{qname}:runs") or 0)
    assert st_runs == 1000 + len(dying)  # a dying member runs twice (max_attempts 2)
    assert app.queue(qname).check() == []
    spawn.stop_all()
    app.close()


def test_members_add_siblings_after_close(
    spawn: Spawner, url: str, qname: str, r: redis.Redis
) -> None:
    """A running member adds to its own batch after the producer closed it: the batch waits
    for the new members too, and fires once."""
    app, member, fired = _batch_app(url, qname)
    b = app.batch(on_complete=fired.s("complete"), on_success=fired.s("success"))
    b.add_many([member.s(n, spawn=3) for n in range(1, 4)])
    b.close()
    w = spawn.start("worker", "apps.batchapp:app", "-c", "4", env=spawn.env(EMQ_TEST_QUEUE=qname))
    wait_for(lambda: len(_fired(r, qname)) >= 2 and _idle(app.queue(qname)), 120)
    assert _fired(r, qname) == [f"complete:{b.id}", f"success:{b.id}"]
    assert int(r.get(f"emqtest:{qname}:runs") or 0) == 3 + 9
    assert w.popen.poll() is None
    app.close()


def test_the_last_settles_race_and_each_callback_fires_once(
    spawn: Spawner, url: str, qname: str, r: redis.Redis
) -> None:
    """Many small batches, each closed first, their members claimed by 4 processes at once:
    whichever settle is last, each batch's callbacks fire exactly once."""
    app, member, fired = _batch_app(url, qname)
    q = app.queue(qname)
    q.pause()  # the members of every batch wait, so the workers settle them at once
    batches = []
    for i in range(40):
        b = app.batch(on_complete=fired.s("complete"), on_death=fired.s("death"))
        b.add_many([member.s(n, fail=(i % 4 == 0 and n == 0)) for n in range(4)])
        b.close()
        batches.append(b)
    env = spawn.env(EMQ_TEST_QUEUE=qname)
    for w in [spawn.start("worker", "apps.batchapp:app", "-c", "4", env=env) for _ in range(4)]:
        wait_log(w, "serving")
    q.resume()
    want = sorted([f"complete:{b.id}" for b in batches] + [f"death:{b.id}" for b in batches[::4]])
    wait_for(lambda: len(_fired(r, qname)) >= len(want) and _idle(q), 120)
    assert _fired(r, qname) == want
    assert q.check() == []
    app.close()


def test_cli_shows_a_batch(url: str, qname: str, r: redis.Redis) -> None:
    import json

    from click.testing import CliRunner

    from echomq.cli import main

    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"), description="cli")
    members = b.add_many([t["member"].s(i) for i in range(3)])
    _drain(app.queue(qname), fail={members[1]})
    runner = CliRunner(env={"COLUMNS": "400", "ECHOMQ_URL": None})
    out = runner.invoke(main, ["--url", url, "batch", qname, b.id])
    assert out.exit_code == 0, out.output
    assert "total: 3  pending: 0  succeeded: 2  dead: 1" in out.output
    assert f"dead: {members[1]}" in out.output
    out = runner.invoke(main, ["--url", url, "batch", qname, b.id, "--json"])
    got = json.loads(out.stdout)
    assert (got["total"], got["dead"], got["closed"], got["description"]) == (3, 1, False, "cli")
    assert got["failed_ids"] == [members[1]]
    out = runner.invoke(main, ["--url", url, "batch", qname, echomq.ids.mint()])
    assert out.exit_code == 1 and "no batch" in out.output
    app.close()


def _lapse(q: echomq.Queue, r: redis.Redis, jid: str) -> None:
    """Make ``jid``'s lease lapse now (its deadline in the past), without waiting."""
    r.zadd(f"emq:{{{q.name}}}:active", {jid: 1})


def test_stall_death_reap_and_cancel_settle_members(url: str, qname: str, r: redis.Redis) -> None:
    """The other paths a member leaves by: a stall death counts as its death (on_death), a
    reaped lease is no settle (its rerun counts once), a cancelled waiting member leaves the
    batch (it stops waiting for it)."""
    app, t = _app(url, qname)
    b = app.batch(
        on_complete=t["cb"].s("complete"),
        on_success=t["cb"].s("success"),
        on_death=t["cb"].s("death"),
    )
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    stalled, reaped, cancelled, plain = b.add_many([t["member"].s(i) for i in range(4)])
    b.close()
    assert {q.claim().id, q.claim().id} == {stalled, reaped}  # type: ignore[union-attr]
    _lapse(q, r, stalled)
    assert q.sweep_stalled(max_stalled=1) == ([], [stalled])  # past its stall budget: dead
    st = b.status()
    assert (st.dead, st.first_death, st.pending) == (1, stalled, 3)
    _lapse(q, r, reaped)
    assert q.reap() == 1  # back to waiting: no settle, nothing counted
    assert b.status().pending == 3
    q.cancel(cancelled)
    st = b.status()
    assert (st.total, st.pending) == (3, 2)  # the cancelled member left the batch
    seen = _drain(q)
    assert {reaped, plain} <= {j.id for j in seen}
    assert _callbacks(r, seen, cbs) == ["complete", "death"]
    assert q.check() == []
    app.close()


def test_check_names_an_undecided_release(url: str, qname: str, r: redis.Redis) -> None:
    app, t = _app(url, qname)
    q = app.queue(qname)
    b = app.batch(on_complete=t["cb"].s("c"), on_success=t["cb"].s("s"))
    b.add(t["member"].s(1))
    assert q.check() == []
    b.close()
    _drain(q)  # the member; then on_complete and on_success run: the batch is gone
    b2 = app.batch(on_complete=t["cb"].s("c"), on_success=t["cb"].s("s"))
    b2.add(t["member"].s(1))
    b2.close()
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token)  # released: the anchor waits to run
    assert q.check() == []
    anchor = f"emq:{{{qname}}}:job:{b2.id}"
    r.hset(anchor, "batch", "closed")  # as a release that decided nothing would leave it
    assert any("but its anchor is pending" in v for v in q.check())
    r.hset(anchor, mapping={"batch": "success", "on_death": "x"})
    assert any("callback undecided" in v for v in q.check())
    app.close()


def test_several_producers_add_to_one_batch(url: str, qname: str, r: redis.Redis) -> None:
    """Four producers (their own apps and connections) add to one batch at once, one closes
    it after all: every member counts once and the callbacks fire once."""
    import threading

    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"), on_success=t["cb"].s("success"))
    q = app.queue(qname)
    cbs = _cb_ids(r, q, b.id)
    added: list[list[str]] = []

    def produce(k: int) -> None:
        other, ot = _app(url, qname)
        handle = other.batch_by_id(b.id, queue=qname)
        mine = []
        for start in range(0, 50, 10):
            mine += handle.add_many(
                [ot["member"].s(k * 1000 + i) for i in range(start, start + 10)]
            )
        added.append(mine)
        other.close()

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(len(a) for a in added) == [50] * 4
    assert b.status().total == 200
    b.close()
    seen = _drain(q)
    assert _callbacks(r, seen, cbs) == ["complete", "success"]
    assert len({j.id for j in seen}) == 200 + 2
    assert q.check() == []
    app.close()


def test_a_member_id_readmitted_into_its_batch_is_refused(
    url: str, qname: str, r: redis.Redis
) -> None:
    """A named member that completed (its row gone) cannot join the same batch again: its
    settle would find its old record and count nothing, and the batch would never finish."""
    app, t = _app(url, qname)
    b = app.batch(on_complete=t["cb"].s("complete"))
    q = app.queue(qname)
    named = echomq.ids.mint()
    b.add(t["member"].s(1).options(id=named))
    _drain(q)
    with pytest.raises(echomq.StateError, match="exists"):
        b.add(t["member"].s(2).options(id=named))
    assert q.job_state(named) == "absent"
    b.close()
    assert b.status().complete
    app.close()
