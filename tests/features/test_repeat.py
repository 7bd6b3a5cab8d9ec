"""Repeatable and cron jobs (D19) on the wire: registration, firing exactly once on the server
clock, missed fires, cron next-fire computation across DST, bad input, and N processes
firing one repeat at once.

The cron and DST tests and the multi-process fire are in test_repeat_cron.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any

import pytest
import redis
from repeat_support import (
    BERLIN,
    _pending,
)

import echomq
from conftest import server_ms, snapshot, wait_for
from echomq import ids
from echomq.protocol.compose import Repeat, cron_next, occurrence_id


def _occurrence(r: redis.Redis, queue: str, name: str, fire_ms: int) -> str:
    """The id of ``name``'s occurrence at ``fire_ms``, from the slot its row holds."""
    slot = r.hget(f"emq:{{{queue}}}:repeat:{name}", "slot")
    assert slot is not None, f"{name} has no slot"
    return occurrence_id(int(slot), fire_ms)


def test_repeat_registers_updates_lists_and_unrepeats(anyq: Any, r: redis.Redis) -> None:
    before = server_ms(r)
    assert anyq.repeat("tick", b"p", every_ms=60_000) == "registered"
    [rep] = anyq.repeats()
    assert rep.name == "tick" and rep.every_ms == 60_000 and rep.cron is None
    assert before + 60_000 <= rep.next_ms <= server_ms(r) + 60_000
    # Same schedule again (a worker restart): "updated", the phase is kept.
    assert anyq.repeat("tick", b"p2", every_ms=60_000) == "updated"
    assert anyq.repeats()[0].next_ms == rep.next_ms
    base = f"emq:{{{anyq.name}}}:"
    assert r.hget(base + "repeat:tick", "payload") == b"p2"
    # A new schedule moves the next fire.
    anyq.repeat("tick", b"p2", cron="0 3 * * *", tz="Europe/Berlin", group="night")
    [rep2] = anyq.repeats()
    assert rep2 == Repeat("tick", rep2.next_ms, None, "0 3 * * *", "Europe/Berlin", "night")
    assert datetime.fromtimestamp(rep2.next_ms / 1000, BERLIN).strftime("%H:%M") == "03:00"
    assert anyq.unrepeat("tick") is True
    assert anyq.unrepeat("tick") is False
    assert anyq.repeats() == []
    assert not r.exists(base + "repeat", base + "repeat:tick")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "not a cron"},
        {"cron": "61 * * * *"},
        {"cron": "* * * * * *"},
        {"cron": "*/5 * * * *", "tz": "Mars/Olympus"},
        {"cron": "0 0 30 2 *"},  # well-formed, but February 30th never comes
        {"cron": "0 0 31 4,6 *"},
        {"cron": "*/5 * * * *", "every_ms": 1000},
        {},
        {"every_ms": 0},
        {"every_ms": -5},
        {"every_ms": "1000"},
        {"every_ms": 1000, "tz": ""},
    ],
)
def test_bad_repeat_is_a_typed_error_and_writes_nothing(
    q: echomq.Queue, r: redis.Redis, kwargs: dict[str, Any]
) -> None:
    before = snapshot(r, q.name)
    with pytest.raises(echomq.InvalidArgument):
        q.repeat("tick", b"p", **kwargs)
    assert snapshot(r, q.name) == before
    for name in ["", "a b", "x" * 129, None]:
        with pytest.raises(echomq.InvalidArgument):
            q.repeat(name, b"p", every_ms=1000)  # type: ignore[arg-type]
    with pytest.raises(echomq.InvalidArgument):
        q.fire_due(0)
    assert snapshot(r, q.name) == before


def test_fire_due_enqueues_once_and_advances_on_the_grid(anyq: Any, r: redis.Redis) -> None:
    base = f"emq:{{{anyq.name}}}:"
    assert anyq.fire_due() == 0  # nothing registered: one call, nothing written
    anyq.repeat("tick", b"payload", every_ms=1000, group="g1")
    assert anyq.fire_due() == 0  # not due yet
    # Pretend the fleet was down for 10.5 periods: the entry was due long ago.
    now = server_ms(r)
    old = now - 10_500
    r.zadd(base + "repeat", {"tick": old})
    assert anyq.fire_due() == 1  # once, not once per missed period
    assert anyq.fire_due() == 0
    jid = _occurrence(r, anyq.name, "tick", old)
    assert anyq.browse("pending", group="g1") == [jid]
    assert r.hget(base + "job:" + jid, "payload") == b"payload"
    nxt = anyq.repeats()[0].next_ms
    assert (nxt - old) % 1000 == 0 and now < nxt <= now + 1000 + 50
    assert anyq.check() == []


def test_cron_entry_fires_once_and_advances_by_compare_and_set(anyq: Any, r: redis.Redis) -> None:
    base = f"emq:{{{anyq.name}}}:"
    anyq.repeat("nightly", b"x", cron="0 3 * * *", tz="Europe/Berlin")
    old = server_ms(r) - 5_000
    r.zadd(base + "repeat", {"nightly": old})
    assert anyq.fire_due() == 1
    assert anyq.fire_due() == 0
    assert _pending(anyq) == [_occurrence(r, anyq.name, "nightly", old)]
    nxt = anyq.repeats()[0].next_ms
    assert nxt > server_ms(r)
    assert datetime.fromtimestamp(nxt / 1000, BERLIN).strftime("%H:%M") == "03:00"


def test_a_stale_compare_and_set_fires_nothing(q: echomq.Queue, r: redis.Redis) -> None:
    """Two callers computed the same cron advance: the second one's CAS finds the score
    moved and neither enqueues nor moves it again."""
    base = f"emq:{{{q.name}}}:"
    q.repeat("c", b"x", cron="*/5 * * * *")
    old = server_ms(r) - 1_000
    r.zadd(base + "repeat", {"c": old})
    nxt = cron_next("*/5 * * * *", "UTC", server_ms(r))
    script = echomq.protocol.scripts.SCRIPTS["repeat_fire"]
    keys = [base + "repeat", base + "meta"]
    first = r.eval(script.source, 2, *keys, base, 100, 0, 1, "c", old, nxt)
    second = r.eval(script.source, 2, *keys, base, 100, 0, 1, "c", old, nxt + 300_000)
    assert first[0] == 1 and second[0] == 0
    assert r.zscore(base + "repeat", "c") == nxt
    assert len(_pending(q)) == 1


def test_occurrence_id_matches_the_script(r: redis.Redis) -> None:
    """The Lua computes the id with two-limb float arithmetic: check it against Python's
    exact ints, including the largest fire times and the 2^41 ms wrap."""
    src = echomq.protocol.scripts._expand(
        "--@include common\n--@include admit\n--@include compose\n",
        echomq.protocol.scripts._LUA,
    )
    body = src + "\nreturn occurrence_id(tonumber(ARGV[1]), tonumber(ARGV[2]))"
    cases = [(0, 1_700_000_000_000), (1, 4_000_000_000_000), ((1 << 22) - 1, 0)]
    cases += [(12345, ids.EPOCH_MS + (1 << 41) - 1), ((1 << 22) - 1, ids.EPOCH_MS)]
    for slot, ms in cases:
        jid = occurrence_id(slot, ms)
        assert ids.is_valid(jid) and jid.startswith("JOB")
        assert r.eval(body, 0, slot, ms) == jid.encode()
    for bad in (-1, 1 << 22, True, "1"):
        with pytest.raises(echomq.InvalidArgument):
            occurrence_id(bad, 0)  # type: ignore[arg-type]


def test_occurrence_ids_agree_with_lua(q: echomq.Queue, r: redis.Redis) -> None:
    base = f"emq:{{{q.name}}}:"
    for i, name in enumerate(["a", "tick", "x" * 128, "n.1-2_3"]):
        q.repeat(name, b"x", every_ms=3_600_000)
        old = 1_700_000_000_000 + i * 987_654_321
        r.zadd(base + "repeat", {name: old})
        assert q.fire_due() == 1
        assert r.exists(base + "job:" + _occurrence(r, q.name, name, old))


def _colliding_names() -> tuple[str, str]:
    """Two names whose 22 low bits of SHA-1 agree: the identity occurrence ids took before
    slots (two such repeats on one schedule shared every occurrence id)."""
    import hashlib

    seen: dict[int, str] = {}
    for i in range(1_000_000):
        name = f"tenant-{i}"
        h = int(hashlib.sha1(name.encode()).hexdigest()[:6], 16) % (1 << 22)
        if h in seen:
            return seen[h], name
        seen[h] = name
    raise AssertionError("no collision found")  # pragma: no cover


@pytest.mark.executors
def test_repeats_whose_name_hashes_collide_both_fire_every_occurrence(
    q: echomq.Queue, r: redis.Redis
) -> None:
    a, b = _colliding_names()
    base = f"emq:{{{q.name}}}:"
    q.repeat(a, b"a", every_ms=60_000)
    q.repeat(b, b"b", every_ms=60_000)
    times: list[int] = []
    start = server_ms(r)
    for i in range(3):
        # Both on one schedule: the same fire time, due now (a new one each round).
        old = start - 1_000 - 7 * i
        r.zadd(base + "repeat", {a: old, b: old})
        assert q.fire_due() == 2, i
        assert len(_pending(q)) == 2 * (i + 1)
        times.append(old)
    fired = [_occurrence(r, q.name, n, t) for t in times for n in (a, b)]
    assert sorted(_pending(q)) == sorted(fired) and len(set(fired)) == 6
    assert {r.hget(base + "job:" + j, "payload") for j in fired} == {b"a", b"b"}
    assert q.check() == []


@pytest.mark.executors
def test_slots_are_unique_reused_after_unrepeat_and_bounded(
    q: echomq.Queue, r: redis.Redis
) -> None:
    base = f"emq:{{{q.name}}}:"
    for name in ("x", "y", "z"):
        q.repeat(name, b"p", every_ms=1000)
    slots = {n: r.hget(base + "repeat:" + n, "slot") for n in ("x", "y", "z")}
    assert sorted(slots.values()) == [b"0", b"1", b"2"]
    q.repeat("y", b"p2", cron="* * * * *")  # an update keeps its slot
    assert r.hget(base + "repeat:y", "slot") == slots["y"]
    assert q.unrepeat("y") is True
    q.repeat("w", b"p", every_ms=1000)  # the freed slot, not a fourth one
    assert r.hget(base + "repeat:w", "slot") == slots["y"]
    # Every slot held: a new name is a typed refusal and writes nothing; updates still work.
    r.hset(base + "meta", "repeat_slots", 1 << 21)
    before = snapshot(r, q.name)
    with pytest.raises(echomq.StateError):
        q.repeat("v", b"p", every_ms=1000)
    assert snapshot(r, q.name) == before
    assert q.repeat("x", b"p3", every_ms=1000) == "updated"
    q.unrepeat("z")
    assert q.repeat("v", b"p", every_ms=1000) == "registered"
    assert r.hget(base + "repeat:v", "slot") == slots["z"]


@pytest.mark.executors
def test_a_row_without_slot_is_migrated_on_its_next_fire_or_repeat_set(
    q: echomq.Queue, r: redis.Redis
) -> None:
    """A repeat written before slots existed keeps firing: the first fire (or repeat_set)
    gives it a slot, and its occurrences take ids from it from then on."""
    base = f"emq:{{{q.name}}}:"
    for name in ("old1", "old2"):
        r.hset(base + "repeat:" + name, mapping={"payload": b"o", "every_ms": "60000"})
        r.hset(base + "repeat:" + name, mapping={"cron": "", "tz": "UTC", "group": ""})
        r.hset(base + "repeat:" + name, mapping={"owner": ""})
    q.repeat("new", b"n", every_ms=60_000)
    old = server_ms(r) - 1_000
    r.zadd(base + "repeat", {"old1": old, "new": old})
    assert q.fire_due() == 2
    assert sorted(_pending(q)) == sorted(
        [_occurrence(r, q.name, "old1", old), _occurrence(r, q.name, "new", old)]
    )
    assert q.repeat("old2", b"o", every_ms=60_000) == "updated"
    slots = [r.hget(base + "repeat:" + n, "slot") for n in ("new", "old1", "old2")]
    assert slots == [b"0", b"1", b"2"]


def test_a_removed_spec_drops_its_entry(q: echomq.Queue, r: redis.Redis) -> None:
    base = f"emq:{{{q.name}}}:"
    q.repeat("gone", b"x", every_ms=1000)
    r.delete(base + "repeat:gone")
    r.zadd(base + "repeat", {"gone": 1})
    assert q.fire_due() == 0
    assert r.zscore(base + "repeat", "gone") is None
    assert _pending(q) == []


def _run_worker(worker: echomq.Worker) -> tuple[threading.Thread, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(worker.arun()), daemon=True)
    t.start()
    return t, loop


def _stop(worker: echomq.Worker, t: threading.Thread, loop: asyncio.AbstractEventLoop) -> None:
    loop.call_soon_threadsafe(worker.stop)
    t.join(60)
    assert not t.is_alive()
    loop.close()


def test_periodic_task_registers_runs_and_drops_stale(url: str, qname: str, r: redis.Redis) -> None:
    seen: list[int] = []
    app = echomq.App(url=url, name="billing")

    @app.periodic(every_ms=200, queue=qname, args=(7,))
    def tick(n: int) -> None:
        seen.append(n)

    q = app.queue(qname)
    # A repeat this app registered earlier and no longer declares, and another app's.
    q.repeat("old", b"x", every_ms=60_000, owner="billing")
    q.repeat("theirs", b"x", every_ms=60_000, owner="other")
    w = echomq.Worker(app, queues=[qname], beat_ms=50)
    t, loop = _run_worker(w)
    try:
        wait_for(lambda: len(seen) >= 3, timeout=60)
    finally:
        _stop(w, t, loop)
    assert set(seen) == {7}
    mine = next(iter(app.periodics.values())).name
    assert mine == tick.name.replace("<", "_").replace(">", "_")  # a legal repeat name
    reps = {rep.name: rep for rep in q.repeats()}
    assert set(reps) == {"theirs", mine}  # "old" was this app's and is gone
    assert reps[mine].owner == "billing" and reps[mine].every_ms == 200
    app.close()


def test_a_worker_beat_survives_a_never_matching_entry(
    url: str, qname: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    app = echomq.App(url=url, name="beats")

    @app.periodic(every_ms=200, queue=qname, args=(1,))
    def tick(n: int) -> None:
        seen.append(n)

    base = f"emq:{{{qname}}}:"
    bad = {"payload": b"x", "every_ms": "", "cron": "0 0 30 2 *", "tz": "UTC", "group": ""}
    r.hset(base + "repeat:feb30", mapping=bad)
    r.zadd(base + "repeat", {"feb30": 1})
    w = echomq.Worker(app, queues=[qname], beat_ms=50)
    t, loop = _run_worker(w)
    try:
        wait_for(lambda: len(seen) >= 3, timeout=60)
    finally:
        _stop(w, t, loop)
    assert not [rec for rec in caplog.records if rec.levelname in ("ERROR", "CRITICAL")]
    app.close()


def test_periodic_bad_schedule_is_refused_at_decoration(url: str) -> None:
    app = echomq.App(url=url)
    with pytest.raises(echomq.InvalidArgument):
        app.periodic(cron="every tuesday")
    with pytest.raises(echomq.InvalidArgument):
        app.periodic(every_ms=1000, cron="* * * * *")
    with pytest.raises(echomq.InvalidArgument):
        app.periodic(cron="* * * * *", tz="Nowhere/Land")
    assert app.tasks == {} and app.periodics == {}


# The native executor sends both scripts as EVALSHA (no twin, like run_now).
@pytest.mark.executors
def test_pause_keeps_the_spec_and_never_fires_resume_starts_from_now(
    anyq: Any, r: redis.Redis
) -> None:
    base = f"emq:{{{anyq.name}}}:"
    anyq.repeat("tick", b"p", every_ms=300, limit=5)
    r.zadd(base + "repeat", {"tick": server_ms(r) - 10})  # due now
    assert anyq.fire_due() == 1
    [rep] = anyq.repeats()
    assert rep.last_ms is not None and rep.last_ms <= server_ms(r) and rep.fired == 1
    assert not rep.paused
    assert anyq.pause_repeat("tick") is True
    assert anyq.pause_repeat("tick") is True  # a resend: the same state
    [rep] = anyq.repeats()
    assert rep.paused and rep.next_ms is None and not rep.ended
    assert rep.every_ms == 300 and rep.limit == 5 and rep.fired == 1
    assert r.hget(base + "repeat:tick", "paused") == b"1"
    assert r.zscore(base + "repeat", "tick") == float("inf")
    # Never fired while paused, whatever the clock says.
    time.sleep(0.4)
    assert anyq.fire_due() == 0
    # Registered again with the same schedule (a worker start), or another one: still paused.
    assert anyq.repeat("tick", b"p2", every_ms=300, limit=5) == "updated"
    assert anyq.repeat("tick", b"p3", every_ms=200, limit=5) == "updated"
    [rep] = anyq.repeats()
    assert rep.paused and rep.next_ms is None and rep.every_ms == 200
    assert anyq.fire_due() == 0
    # Resume: the next fire is now + every_ms on the server clock (the new schedule).
    before = server_ms(r)
    assert anyq.resume_repeat("tick") is True
    [rep] = anyq.repeats()
    assert not rep.paused and before + 200 <= rep.next_ms <= server_ms(r) + 200
    assert r.hget(base + "repeat:tick", "paused") is None
    # A resume of a running repeat leaves its phase alone.
    assert anyq.resume_repeat("tick") is True
    assert anyq.repeats()[0].next_ms == rep.next_ms
    wait_for(lambda: anyq.fire_due() == 1, 60, 0.05)
    assert anyq.repeats()[0].fired == 2
    assert anyq.check() == []


@pytest.mark.executors
def test_resume_of_a_cron_repeat_computes_the_next_fire_after_now(
    anyq: Any, r: redis.Redis
) -> None:
    anyq.repeat("nightly", b"x", cron="30 3 * * *", tz="Europe/Berlin")
    assert anyq.pause_repeat("nightly")
    [rep] = anyq.repeats()
    assert rep.paused and rep.cron == "30 3 * * *" and rep.tz == "Europe/Berlin"
    now = server_ms(r)
    assert anyq.resume_repeat("nightly")
    [rep] = anyq.repeats()
    assert rep.next_ms == cron_next("30 3 * * *", "Europe/Berlin", now) or (
        rep.next_ms == cron_next("30 3 * * *", "Europe/Berlin", server_ms(r))
    )
    assert not rep.paused and not rep.ended


def test_resume_of_a_spent_repeat_stays_spent(q: echomq.Queue, r: redis.Redis) -> None:
    base = f"emq:{{{q.name}}}:"
    q.repeat("once", b"x", every_ms=1000, limit=1)
    r.zadd(base + "repeat", {"once": server_ms(r) - 10})
    assert q.fire_due() == 1
    assert q.repeats()[0].ended
    assert q.pause_repeat("once")
    assert not q.repeats()[0].ended and q.repeats()[0].paused
    assert q.resume_repeat("once")
    [rep] = q.repeats()
    assert rep.ended and not rep.paused and rep.next_ms is None


def test_resume_refuses_a_spec_changed_in_between(q: echomq.Queue, r: redis.Redis) -> None:
    """The cron the client computed from must be the spec's: else nothing is written."""
    from echomq.protocol.scripts import SCRIPTS

    base = f"emq:{{{q.name}}}:"
    q.repeat("nightly", b"x", cron="0 3 * * *")
    q.pause_repeat("nightly")
    before = snapshot(r, q.name)
    keys = [base + "repeat", base + "repeat:nightly"]
    script = SCRIPTS["repeat_resume"]
    got = r.eval(script.source, 2, *keys, "nightly", "0 4 * * *", "UTC", 1)
    assert got == -1 and snapshot(r, q.name) == before
    got = r.eval(script.source, 2, *keys, "nightly", "0 3 * * *", "Europe/Berlin", 1)
    assert got == -1 and snapshot(r, q.name) == before
    with pytest.raises(redis.ResponseError, match="EMQARG"):
        r.eval(script.source, 2, *keys, "nightly", "0 3 * * *", "UTC", "")
    assert snapshot(r, q.name) == before


@pytest.mark.executors
def test_pause_and_resume_of_an_unknown_or_bad_name(q: echomq.Queue, r: redis.Redis) -> None:
    before = snapshot(r, q.name)
    assert q.pause_repeat("nope") is False
    assert q.resume_repeat("nope") is False
    assert snapshot(r, q.name) == before
    for name in ["", "a b", "x" * 129, None, 7]:
        with pytest.raises(echomq.InvalidArgument):
            q.pause_repeat(name)  # type: ignore[arg-type]
        with pytest.raises(echomq.InvalidArgument):
            q.resume_repeat(name)  # type: ignore[arg-type]
    assert snapshot(r, q.name) == before


def test_unrepeat_of_a_paused_repeat_removes_it(q: echomq.Queue, r: redis.Redis) -> None:
    q.repeat("tick", b"x", every_ms=60_000)
    q.pause_repeat("tick")
    assert q.unrepeat("tick") is True
    assert q.repeats() == []
    assert not r.exists(f"emq:{{{q.name}}}:repeat:tick")
    # Registered afresh: not paused (the pause went with the spec).
    q.repeat("tick", b"x", every_ms=60_000)
    assert not q.repeats()[0].paused and q.repeats()[0].next_ms is not None


def test_a_periodic_task_stays_paused_across_a_worker_start(
    url: str, qname: str, r: redis.Redis
) -> None:
    app = echomq.App(url=url, name="pauser")
    seen: list[int] = []

    @app.periodic(every_ms=100, queue=qname, args=(1,))
    def tick(n: int) -> None:
        seen.append(n)

    q = app.queue(qname)
    w = echomq.Worker(app, queues=[qname], beat_ms=50)
    t, loop = _run_worker(w)
    try:
        wait_for(lambda: len(seen) >= 1, timeout=60)
        [rep] = q.repeats()
        assert q.pause_repeat(rep.name)
    finally:
        _stop(w, t, loop)
    fired = q.repeats()[0].last_ms
    # A second worker start registers the periodic again: it stays paused.
    w = echomq.Worker(app, queues=[qname], beat_ms=50)
    t, loop = _run_worker(w)
    try:
        time.sleep(0.6)
        [rep] = q.repeats()
        assert rep.paused and rep.last_ms == fired
    finally:
        _stop(w, t, loop)
    app.close()


def test_cli_repeats_and_unrepeat(url: str, q: echomq.Queue) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    q.repeat("nightly", b"x", cron="0 3 * * *", tz="Europe/Berlin", group="ops")
    q.repeat("tick", b"x", every_ms=60_000)
    runner = CliRunner()
    out = runner.invoke(main, ["--url", url, "repeats", q.name])
    assert out.exit_code == 0, out.output
    lines = {line.split()[0]: line for line in out.output.splitlines()}
    assert set(lines) == {"tick", "nightly"}
    assert "every 60000 ms" in lines["tick"]
    assert "cron '0 3 * * *' Europe/Berlin" in lines["nightly"] and "group=ops" in lines["nightly"]
    out = runner.invoke(main, ["--url", url, "unrepeat", q.name, "tick"])
    assert out.exit_code == 0 and "removed" in out.output
    out = runner.invoke(main, ["--url", url, "unrepeat", q.name, "tick"])
    assert out.exit_code == 1
    assert [rep.name for rep in q.repeats()] == ["nightly"]
    out = runner.invoke(main, ["--url", url, "unrepeat", q.name, "bad name"])
    assert out.exit_code == 2


def test_cli_pause_and_resume_repeat(url: str, q: echomq.Queue) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    q.repeat("tick", b"x", every_ms=60_000)
    runner = CliRunner()
    out = runner.invoke(main, ["--url", url, "pause-repeat", q.name, "tick"])
    assert out.exit_code == 0 and "paused" in out.output, out.output
    assert q.repeats()[0].paused
    out = runner.invoke(main, ["--url", url, "repeats", q.name])
    assert "paused" in out.output
    out = runner.invoke(main, ["--url", url, "resume-repeat", q.name, "tick"])
    assert out.exit_code == 0 and "resumed" in out.output, out.output
    assert not q.repeats()[0].paused
    out = runner.invoke(main, ["--url", url, "pause-repeat", q.name, "nope"])
    assert out.exit_code == 1
    out = runner.invoke(main, ["--url", url, "resume-repeat", q.name, "bad name"])
    assert out.exit_code == 2
