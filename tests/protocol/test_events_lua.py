"""Events (D15) and metrics (D16), the server side: every transition script appends its event
to emq:{q}:events in the same script as its move (so an event exists exactly when the move
happened), and the settling scripts write the per-minute series. Real redis-server only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import server_ms, wait_for
from echomq import ids
from echomq.errors import EchoMQError, InvalidArgument, JobGone, KindError, StaleToken
from echomq.events import EventListener


def _k(q: Any, t: str) -> str:
    return f"emq:{{{q.name}}}:{t}"


def _events(q: Any) -> list[tuple[str, str | None, dict[str, str]]]:
    # XRANGE straight from the server: the whole stream, nothing hidden by a reader.
    return [(e.event, e.id, e.fields) for e in q.events(count=100_000)]


def _names(q: Any) -> list[tuple[str, str | None]]:
    return [(e, i) for e, i, _ in _events(q)]


def _xlen(r: redis.Redis, q: Any) -> int:
    return int(r.xlen(_k(q, "events")))


# --------------------------------------------------------------------------- transitions


def test_a_lifecycle_emits_every_move_in_order(anyq: Any, r: redis.Redis) -> None:
    anyq.enable_events(1000)
    a = anyq.enqueue(b"a").id
    b = anyq.enqueue(b"b", group="t1").id
    c = anyq.enqueue(b"c", delay_ms=60_000).id
    assert _names(anyq) == [("enqueued", a), ("enqueued", b), ("scheduled", c)]
    evs = _events(anyq)
    assert evs[1][2] == {"group": "t1"}
    assert int(evs[2][2]["run_at"]) >= server_ms(r) + 50_000

    ja = anyq.claim()
    jb = anyq.claim()
    assert {ja.id, jb.id} == {a, b}
    active = [e for e in _events(anyq) if e[0] == "active"]
    assert [(e[1], e[2]["attempts"]) for e in active] == [(ja.id, "1"), (jb.id, "1")]

    # retry that schedules -> retried (delay_ms); promote -> promoted; at the ceiling -> dead.
    assert anyq.retry(a, ja.token, delay_ms=0, max_attempts=5, error="boom") == "scheduled"
    assert _events(anyq)[-1] == ("retried", a, {"attempts": "1", "delay_ms": "0"})
    time.sleep(0.01)
    assert anyq.promote() == 1
    assert _names(anyq)[-1] == ("promoted", a)
    ja = anyq.claim()
    assert ja is not None and ja.id == a
    assert anyq.retry(a, ja.token, delay_ms=0, max_attempts=2, error="no more") == "dead"
    assert _events(anyq)[-1] == ("dead", a, {"attempts": "2", "error": "no more"})
    anyq.reprocess(a)
    assert _names(anyq)[-1] == ("reprocessed", a)

    anyq.complete(jb.id, jb.token)
    assert _events(anyq)[-1] == ("completed", b, {"group": "t1", "attempts": "1"})
    anyq.remove(c)
    assert _events(anyq)[-1] == ("removed", c, {"state": "scheduled"})
    assert anyq.drain() == 1  # a, pending again
    assert _events(anyq)[-1] == ("drained", None, {"count": "1"})
    assert anyq.check() == []


def test_batches_emit_one_event_per_job(anyq: Any) -> None:
    anyq.enable_events(1000)
    verdicts = anyq.enqueue_many([b"1", b"2", b"3", b"4"], group="g")
    jids = [v.id for v in verdicts]
    assert _names(anyq) == [("enqueued", j) for j in jids]
    jobs = anyq.claim_batch(3)
    assert [(e, i) for e, i in _names(anyq)[4:]] == [("active", j.id) for j in jobs]
    before = len(_events(anyq))
    s = anyq.settle(
        completed=[(jobs[0].id, jobs[0].token), (jobs[1].id, jobs[1].token)],
        retried=[(jobs[2].id, jobs[2].token, 0, 1, "bad")],
        n=5,
    )
    assert s.completed == [None, None] and s.retried == ["dead"]
    after = _names(anyq)[before:]
    assert after == [
        ("completed", jobs[0].id),
        ("completed", jobs[1].id),
        ("dead", jobs[2].id),
        ("active", jids[3]),
    ]
    assert s.jobs[0].id == jids[3]
    assert anyq.complete_many([(jids[3], s.jobs[0].token)]) == []
    assert _names(anyq)[-1] == ("completed", jids[3])


def test_a_refused_settle_emits_nothing(anyq: Any, r: redis.Redis) -> None:
    anyq.enable_events(1000)
    jid = anyq.enqueue(b"x").id
    old = anyq.claim(lease_ms=1)
    time.sleep(0.02)
    assert anyq.reap() == 1
    assert _names(anyq)[-1] == ("reaped", jid)
    new = anyq.claim()
    assert new is not None and new.token == old.token + 1
    n = _xlen(r, anyq)
    # Every settle verb with the stale token is refused, and none of them emits.
    with pytest.raises(StaleToken):
        anyq.complete(jid, old.token)
    with pytest.raises(StaleToken):
        anyq.retry(jid, old.token, delay_ms=0, max_attempts=9, error="e")
    with pytest.raises(StaleToken):
        anyq.delay(jid, old.token, 0)
    with pytest.raises(StaleToken):
        anyq.extend(jid, old.token, lease_ms=1000)
    assert anyq.complete_many([(jid, old.token)]) == [jid]
    s = anyq.settle(completed=[(jid, old.token)], retried=[(jid, old.token, 0, 1, "e")])
    assert isinstance(s.completed[0], StaleToken) and isinstance(s.retried[0], StaleToken)
    assert anyq.extend_many([(jid, old.token)], lease_ms=1000) == [jid]
    # Gone: a job settled twice, progress of an unknown id.
    anyq.complete(jid, new.token)
    n = _xlen(r, anyq)
    with pytest.raises(JobGone):
        anyq.complete(jid, new.token)
    with pytest.raises(JobGone):
        anyq.update_progress(ids.mint(), "1")
    with pytest.raises(JobGone):
        anyq.remove(ids.mint())
    assert _xlen(r, anyq) == n


def _entries(r: redis.Redis, q: Any) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in r.xrange(f"emq:{{{q.name}}}:events")
    ]


def test_a_duplicate_emits_duplicate_and_a_refused_call_nothing(anyq: Any, r: redis.Redis) -> None:
    # D15 lists every admission verdict: a duplicate id is an event (`duplicate`); a call
    # refused before any write (a wrong kind, a bad argument) emits nothing.
    anyq.enable_events(1000)
    jid = ids.mint()
    assert anyq.enqueue(b"x", id=jid).status == "enqueued"
    n = _xlen(r, anyq)
    assert anyq.enqueue(b"x", id=jid).status == "duplicate"
    assert _entries(r, anyq)[-1] == {"event": "duplicate", "id": jid}
    with pytest.raises(KindError):
        anyq.enqueue(b"x", id=ids.mint("PRT"))
    with pytest.raises(InvalidArgument):
        anyq.enqueue(b"x", delay_ms=-1)
    assert _xlen(r, anyq) == n + 1
    out = anyq.enqueue_many([(jid, b"again"), (ids.mint("PRT"), b"k")])
    assert out[0].status == "duplicate" and isinstance(out[1], EchoMQError)
    assert _xlen(r, anyq) == n + 2
    assert _entries(r, anyq)[-1] == {"event": "duplicate", "id": jid}


def test_a_deduplicated_enqueue_emits_deduplicated(anyq: Any, r: redis.Redis) -> None:
    anyq.enable_events(1000)
    holder = anyq.enqueue(b"x", dedup="k").id
    refused = ids.mint()
    got = anyq.enqueue(b"y", id=refused, dedup="k")
    assert got.status == "deduplicated" and got.id == holder
    assert _entries(r, anyq)[-1] == {
        "event": "deduplicated",
        "id": holder,
        "dedup": "k",
        "refused": refused,
    }
    assert r.exists(f"emq:{{{anyq.name}}}:job:{refused}") == 0


def test_stalls_delays_rearms_and_progress(anyq: Any, r: redis.Redis) -> None:
    anyq.enable_events(1000)
    a = anyq.enqueue(b"a").id
    b = anyq.enqueue(b"b", group="L").id
    ja, jb = anyq.claim(lease_ms=1), anyq.claim(lease_ms=1)
    time.sleep(0.02)
    recovered, dead = anyq.sweep_stalled(max_stalled=1)
    assert recovered == [] and sorted(dead) == sorted([a, b])
    tail = {e[1]: e for e in _events(anyq)[-2:]}
    assert tail[a] == ("dead", a, {"error": "stalled", "stalled": "1"})
    assert tail[b] == ("dead", b, {"group": "L", "error": "stalled", "stalled": "1"})
    anyq.reprocess(a)
    ja = anyq.claim(lease_ms=1)
    time.sleep(0.02)
    assert anyq.sweep_stalled(max_stalled=5) == ([a], [])
    assert _events(anyq)[-1] == ("stalled", a, {"stalled": "1"})

    ja = anyq.claim(lease_ms=60_000)
    anyq.delay(a, ja.token, 60_000)
    assert _events(anyq)[-1] == ("delayed", a, {"attempts": str(ja.token), "delay_ms": "60000"})

    # A lapsed lease reaped back to pending and extended by its holder: active again.
    anyq.reprocess(b)
    jb = anyq.claim(lease_ms=1)
    time.sleep(0.02)
    assert anyq.reap() == 1
    anyq.extend(b, jb.token, lease_ms=60_000)
    assert _events(anyq)[-2:] == [
        ("reaped", b, {"group": "L"}),
        ("active", b, {"group": "L", "attempts": str(jb.token), "rearmed": "1"}),
    ]
    anyq.update_progress(b, "42%")
    assert _events(anyq)[-1] == ("progress", b, {"progress": "42%"})
    assert anyq.reassign(a, "M") == "reassigned"  # scheduled: only the row's lane changes
    assert _events(anyq)[-1] == ("reassigned", a, {"group": "M", "from": ""})
    assert anyq.check() == []


def test_pause_and_resume_emit_only_real_changes(anyq: Any) -> None:
    anyq.enable_events(1000)
    anyq.pause()
    anyq.pause()
    anyq.resume()
    anyq.resume()
    anyq.pause_lane("L")
    anyq.pause_lane("L")
    anyq.resume_lane("L")
    anyq.resume_lane("L")
    assert _events(anyq) == [
        ("paused", None, {}),
        ("resumed", None, {}),
        ("paused", None, {"group": "L"}),
        ("resumed", None, {"group": "L"}),
    ]


def test_the_stream_stays_bounded(q: echomq.Queue, r: redis.Redis) -> None:
    q.enable_events(10)
    q.enqueue_many([b"x"] * 1000)
    # MAXLEN ~ trims whole stream nodes (100 entries by default): near the bound, not at it.
    assert 10 <= _xlen(r, q) <= 210


# --------------------------------------------------------------------------- off


def test_events_off_write_no_stream(anyq: Any, r: redis.Redis) -> None:
    def lifecycle() -> None:
        a = anyq.enqueue(b"a", group="L").id
        anyq.enqueue(b"s", delay_ms=1)
        anyq.enqueue_many([b"m", b"n"])
        anyq.pause()
        anyq.resume()
        anyq.pause_lane("L")
        anyq.resume_lane("L")
        jobs = anyq.claim_batch(2)
        anyq.update_progress(jobs[0].id, "1")
        anyq.complete(jobs[0].id, jobs[0].token)
        anyq.retry(jobs[1].id, jobs[1].token, delay_ms=0, max_attempts=1, error="x")
        anyq.reprocess(jobs[1].id)
        time.sleep(0.01)
        anyq.promote()
        s = anyq.settle(n=10, lease_ms=1)
        time.sleep(0.02)
        anyq.reap()
        s = anyq.settle(n=10, lease_ms=1)
        time.sleep(0.02)
        anyq.sweep_stalled(max_stalled=1)
        assert s.jobs
        anyq.remove(a)
        anyq.drain()

    lifecycle()
    assert r.exists(_k(anyq, "events")) == 0
    # Turned on then off again: the stream keeps what it had and grows no more.
    anyq.enable_events(100)
    anyq.enqueue(b"one")
    anyq.disable_events()
    lifecycle()
    assert _xlen(r, anyq) == 1


# --------------------------------------------------------------------------- listener


def test_a_listener_resumes_after_a_restart_and_loses_nothing(
    q: echomq.Queue, tmp_path: Path
) -> None:
    q.enable_events(10_000)
    store = tmp_path / "last-id"
    first: list[tuple[str, str | None]] = []
    listener = EventListener(q, store=store)
    listener.on("*", lambda e: first.append((e.event, e.id)))
    a = q.enqueue(b"a").id
    job = q.claim()
    assert job is not None
    while listener.poll(block_ms=100):
        pass
    assert first == [("enqueued", a), ("active", a)]

    # The listener is gone; the queue keeps moving.
    q.complete(job.id, job.token)
    more = [v.id for v in q.enqueue_many([b"x"] * 250)]
    second: list[tuple[str, str | None]] = []
    again = EventListener(q, store=store, count=100)
    again.on("*", lambda e: second.append((e.event, e.id)))
    while again.poll(block_ms=100):
        pass
    assert second == [("completed", a)] + [("enqueued", m) for m in more]


# --------------------------------------------------------------------------- metrics


def _minute(r: redis.Redis) -> int:
    return int(r.time()[0]) // 60


def test_completions_and_dead_letters_land_in_the_series(anyq: Any, r: redis.Redis) -> None:
    # The settles below and the reads of the series run in one server minute, or, when the
    # minute turned on the way (a busy machine, issue 36), across two: then only the sums are
    # known. The minutes read first and last tell which.
    first = _minute(r)
    jids = [v.id for v in anyq.enqueue_many([b"x"] * 12)]
    jobs = anyq.claim_batch(12, lease_ms=60_000)
    assert len(jobs) == 12
    anyq.complete(jobs[0].id, jobs[0].token)  # complete
    assert anyq.complete_many([(j.id, j.token) for j in jobs[1:4]]) == []  # batch
    s = anyq.settle(
        completed=[(j.id, j.token) for j in jobs[4:7]],
        retried=[(jobs[7].id, jobs[7].token, 0, 1, "dead"), (jobs[8].id, jobs[8].token, 0, 9, "x")],
    )
    assert s.retried == ["dead", "scheduled"]
    assert anyq.retry(jobs[9].id, jobs[9].token, delay_ms=0, max_attempts=1, error="e") == "dead"
    # Refused settles count nothing.
    with pytest.raises(StaleToken):
        anyq.complete(jobs[10].id, jobs[10].token + 1)
    assert anyq.complete_many([(jobs[0].id, jobs[0].token)]) == [jobs[0].id]
    # A stall death is a dead-letter too.
    anyq.remove(jobs[11].id)
    late = anyq.enqueue(b"late").id
    anyq.claim(lease_ms=1)
    time.sleep(0.02)
    assert anyq.sweep_stalled(max_stalled=1)[1] == [late]

    done = anyq.metrics("completed", minutes=5)
    failed = anyq.metrics("failed", minutes=5)
    series = r.lrange(_k(anyq, "metrics:completed:data"), 0, -1)
    if _minute(r) == first:
        assert done == [7, 0, 0, 0, 0]
        assert failed == [3, 0, 0, 0, 0]
        # The series' layout, on the wire: newest first, "<minute>:<count>".
        assert series == [f"{first}:7".encode()]
    else:  # the minute turned on the way: the counts are split, the sums hold
        assert sum(done) == 7 and sum(failed) == 3
        assert sum(int(e.split(b":")[1]) for e in series) == 7
    # The all-time counters move with the series (counts() reads them).
    c = anyq.counts()
    assert c["completed"] == 7 and c["failed"] == 3
    assert jids


def test_a_minute_of_history_is_shared_and_bounded(q: echomq.Queue, r: redis.Redis) -> None:
    # An older minute already in the series (another process, an hour ago) stays below.
    key = _k(q, "metrics:completed:data")
    minute = _minute(r)
    r.rpush(key, f"{minute - 60}:4")
    q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token)
    series = q.metrics(minutes=61)
    if _minute(r) == minute:  # read in the minute of the push: its oldest covers minute - 60
        assert series[-1] == 4 and sum(series) == 5
    else:  # a minute turned since the push (a busy machine): minute - 60 is out of range now
        assert sum(series) == 1
    head, older = r.lrange(key, 0, -1)
    assert head.endswith(b":1") and older == f"{minute - 60}:4".encode()


def test_obliterate_deletes_the_stream_and_the_series(q: echomq.Queue, r: redis.Redis) -> None:
    q.enable_events(100)
    q.enqueue(b"x")
    job = q.claim()
    assert job is not None
    q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="e")
    j2 = q.enqueue(b"y").id
    job = q.claim()
    assert job is not None and job.id == j2
    q.complete(job.id, job.token)
    for t in ("events", "metrics:completed:data", "metrics:failed:data"):
        assert r.exists(_k(q, t)) == 1, t
    q.pause()
    q.obliterate(force=True)
    wait_for(lambda: r.keys(_k(q, "*")) == [])
