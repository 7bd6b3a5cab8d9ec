"""Cron repeats against real time: next fires across DST changes (spring forward, fall
back, finer than hourly), never-matching entries, UTC steps, and four processes firing
each occurrence exactly once.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from repeat_support import (
    BERLIN,
    _pending,
)

import echomq
from conftest import server_ms
from echomq.protocol import compose as _compose
from echomq.protocol.compose import cron_next


def _ms(*args: int, tz: ZoneInfo = BERLIN, fold: int = 0) -> int:
    return int(datetime(*args, tzinfo=tz, fold=fold).timestamp() * 1000)  # type: ignore[misc]


def _local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, BERLIN).isoformat()


def test_cron_next_daily_across_spring_forward() -> None:
    # 2026-03-29: Berlin jumps 02:00 CET -> 03:00 CEST; 02:30 does not exist that day.
    after = _ms(2026, 3, 28, 12, 0)
    fires = []
    for _ in range(3):
        after = cron_next("30 2 * * *", "Europe/Berlin", after)
        fires.append(_local(after))
    assert fires == [
        "2026-03-29T03:00:00+02:00",  # the end of the gap, once
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_cron_next_daily_across_fall_back_fires_once() -> None:
    # 2026-10-25: Berlin goes 03:00 CEST -> 02:00 CET; 02:30 happens twice.
    after = _ms(2026, 10, 24, 12, 0)
    fires = []
    for _ in range(3):
        after = cron_next("30 2 * * *", "Europe/Berlin", after)
        fires.append(_local(after))
    assert fires == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]


def test_cron_next_hourly_follows_real_time_across_both_changes() -> None:
    after = _ms(2026, 10, 25, 0, 30)
    fires = []
    for _ in range(4):
        after = cron_next("0 * * * *", "Europe/Berlin", after)
        fires.append(_local(after))
    assert fires == [
        "2026-10-25T01:00:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour is a real hour: it fires
        "2026-10-25T03:00:00+01:00",
    ]
    after = _ms(2026, 3, 29, 0, 30)
    fires = []
    for _ in range(3):
        after = cron_next("0 * * * *", "Europe/Berlin", after)
        fires.append(_local(after))
    # 02:00 does not exist: the hourly job runs once an hour of real time.
    assert fires == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]


def _walk(cron: str, after: int, until: int) -> list[int]:
    fires = []
    while (after := cron_next(cron, "Europe/Berlin", after)) <= until:
        fires.append(after)
    return fires


def test_autumn_change_fires_every_quarter_hour_of_both_hours() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET. After 02:00 CEST comes 02:15 CEST, not 02:00 CET.
    fires = _walk("*/15 * * * *", _ms(2026, 10, 25, 1, 50), _ms(2026, 10, 25, 3, 0))
    assert [_local(f) for f in fires] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:15:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:45:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:15:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T02:45:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    # Every minute of both hours: 120 fires from 02:00 CEST to 02:59 CET, one a real minute.
    minutes = _walk("* * * * *", _ms(2026, 10, 25, 1, 59), _ms(2026, 10, 25, 2, 59, fold=1))
    assert len(minutes) == 120
    assert {b - a for a, b in itertools.pairwise(minutes)} == {60_000}


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Europe/Berlin", (2026, 3, 28)),
        ("Europe/Berlin", (2026, 10, 24)),
        ("Australia/Lord_Howe", (2026, 4, 4)),  # a 30-minute change
        ("Australia/Lord_Howe", (2026, 10, 3)),
    ],
)
def test_finer_than_hourly_fires_once_per_real_period_across_a_change(
    tz: str, day: tuple[int, int, int]
) -> None:
    """Across either change a */15 job fires every 15 minutes of real time: never two fires
    at one instant (the spring gap's matches all map to its end), never a skipped quarter."""
    start = _ms(*day, 12, 0, tz=ZoneInfo(tz))
    fires = []
    after = start
    while (after := cron_next("*/15 * * * *", tz, after)) <= start + 86_400_000:
        fires.append(after)
    assert {b - a for a, b in itertools.pairwise(fires)} == {900_000}
    assert len(fires) == 96


def test_daily_job_fires_once_on_both_change_days() -> None:
    for day in [(2026, 3, 28), (2026, 10, 24)]:
        start = _ms(*day, 12, 0)
        fires = _walk("30 2 * * *", start, start + 86_400_000 + 3_600_000)
        assert len(fires) == 1, [_local(f) for f in fires]
    # From inside the repeated hour (02:35 CET, after the 02:30 CEST fire): the next day.
    nxt = cron_next("30 2 * * *", "Europe/Berlin", _ms(2026, 10, 25, 2, 35, fold=1))
    assert _local(nxt) == "2026-10-26T02:30:00+01:00"


def test_a_never_matching_cron_is_invalid_argument_everywhere(url: str) -> None:
    for cron in ("0 0 30 2 *", "0 0 31 4 *"):
        with pytest.raises(echomq.InvalidArgument):
            cron_next(cron, "UTC", 0)
        with pytest.raises(echomq.InvalidArgument):
            _compose.schedule(None, cron, "UTC")
    app = echomq.App(url=url)
    with pytest.raises(echomq.InvalidArgument):
        app.periodic(cron="0 0 30 2 *", tz="Europe/Berlin")
    assert app.tasks == {} and app.periodics == {}
    app.close()


@pytest.mark.executors
def test_a_never_matching_entry_does_not_stop_the_others(q: echomq.Queue, r: redis.Redis) -> None:
    """A cron entry no client can advance (written by hand, or by an older echomq that took
    it) is left alone: the cron entries due with it still fire, and fire_due does not raise."""
    base = f"emq:{{{q.name}}}:"
    bad = {"payload": b"x", "every_ms": "", "cron": "0 0 30 2 *", "tz": "UTC", "group": ""}
    r.hset(base + "repeat:bad", mapping=bad)
    q.repeat("good", b"g", cron="* * * * *")
    old = server_ms(r) - 1_000
    r.zadd(base + "repeat", {"bad": old - 1, "good": old})
    assert q.fire_due() == 1
    assert [r.hget(base + "job:" + j, "payload") for j in _pending(q)] == [b"g"]
    assert r.zscore(base + "repeat", "bad") == old - 1
    assert r.zscore(base + "repeat", "good") > server_ms(r)  # type: ignore[operator]


def test_cron_next_in_utc_and_steps() -> None:
    t0 = int(datetime(2026, 1, 1, 0, 0, 1, tzinfo=ZoneInfo("UTC")).timestamp() * 1000)
    assert cron_next("*/5 * * * *", "UTC", t0) == t0 - 1000 + 300_000
    assert cron_next("0 0 1 1 *", "UTC", t0) == t0 - 1000 + 365 * 86_400_000


def _fire_loop(url: str, queue: str, ready: Any, stop: Any) -> None:
    with echomq.Queue(queue, url=url) as q:
        q.fire_due()  # connected and warm
        ready.release()
        while not stop.is_set():
            q.fire_due()
            time.sleep(0.01)


def test_four_processes_fire_each_occurrence_exactly_once(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    base = f"emq:{{{q.name}}}:"
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=_fire_loop, args=(url, q.name, ready, stop)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            assert ready.acquire(timeout=60)
        q.repeat("beat", b"x", every_ms=200)
        first = int(r.zscore(base + "repeat", "beat") or 0)
        time.sleep(5.0)
        stop.set()
        end = server_ms(r)
    finally:
        stop.set()
        for p in procs:
            p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    jobs = q.browse("pending", n=10_000)
    assert len(jobs) == len(set(jobs))
    # At most one per grid point up to now (one more may be in flight at `end`). Not "at
    # least that many less one": four firers all late by a period on a busy machine fire
    # once for the periods they missed (PROTOCOL D19), and that was issue 36's kind of flake.
    expected = (end - first) // 200 + 1
    assert 1 <= len(jobs) <= expected + 1, (len(jobs), expected)
    # Each occurrence is one grid point of the repeat, none twice.
    times = sorted(echomq.ids.decode_time_ms(j) for j in jobs)
    assert all((t - first) % 200 == 0 for t in times)
    assert len(set(times)) == len(times)


def test_fire_due_one_call_when_idle(q: echomq.Queue) -> None:
    plan = _compose.fire_due(q._k)
    call = next(plan)
    with pytest.raises(StopIteration) as stop:
        plan.send((0, [], 0, []))
    assert call.script is not None and call.script.name == "repeat_fire"
    assert stop.value.value == 0
