"""Events (D15) and metrics (D16), the client side: switching events on and off, reading a
stream written the way the transition scripts write it, and the per-minute metrics layout
(written here by the very Lua the settling scripts include)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

import echomq
from conftest import blocked_clients, wait_for
from echomq.protocol import observe as _observe
from echomq.protocol.observe import Event, decode_metrics
from echomq.protocol.scripts import include_text


def _xadd(r: redis.Redis, queue: str, event: str, job: str | None = None, **extras: Any) -> str:
    """Append an event exactly as D15's scripts do: XADD key MAXLEN ~ n * event .. id .."""
    fields: dict[str, Any] = {"event": event}
    if job is not None:
        fields["id"] = job
    fields.update(extras)
    sid = r.xadd(f"emq:{{{queue}}}:events", fields, maxlen=1000, approximate=True)
    return sid.decode()


# The settling scripts' own writer (lua/include/observe.lua, inlined through common), called
# alone: what a completion or a dead-letter adds to the per-minute series. ARGV[4] is the
# clock the settling scripts pass (server ms): the tests give it, so a write's minute is the
# test's choice, never the wall clock's (issue 36: a minute that turned mid-test).
BUMP = (
    include_text("common")
    + "\nbump_metrics(ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))"
)


def _bump(r: redis.Redis, queue: str, kind: str, n: int, minute: int | None = None) -> None:
    """Add n to ``kind``'s series as a settle in ``minute`` does (None: the server's clock)."""
    key = f"emq:{{{queue}}}:metrics:{kind}:data"
    at = [] if minute is None else [minute * 60_000]
    r.eval(BUMP, 1, key, f"emq:{{{queue}}}:", kind, n, *at)


def _minute(r: redis.Redis) -> int:
    return int(r.time()[0]) // 60


def _series(counts: dict[int, int], current: int, minutes: int) -> list[int]:
    """What metrics(minutes=) reads in minute ``current`` when ``counts`` (minute -> count)
    were filed: the current minute first, zero-filled."""
    return [counts.get(current - age, 0) for age in range(minutes)]


def read_series(q: Any, r: redis.Redis, kind: str, minutes: int, counts: dict[int, int]) -> None:
    """``q.metrics(kind, minutes=)`` is what ``counts`` (minute -> count) read as in the minute
    the call ran. It reads the server's clock, which may turn between any two steps on a busy
    machine (issue 36): the minutes read before and after the call bracket the one it used."""
    before = _minute(r)
    got = q.metrics(kind, minutes=minutes)
    after = _minute(r)
    assert got in [_series(counts, m, minutes) for m in range(before, after + 1)], (counts, got)


# --------------------------------------------------------------------------- on / off


def test_enable_and_disable_events(anyq: Any, r: redis.Redis) -> None:
    meta = f"emq:{{{anyq.name}}}:meta"
    anyq.enable_events(500)
    assert r.hget(meta, "events") == b"500"
    anyq.enable_events()
    assert r.hget(meta, "events") == b"10000"
    anyq.disable_events()
    assert r.hget(meta, "events") is None
    anyq.disable_events()  # idempotent


@pytest.mark.parametrize("bad", [0, -1, "10", 1.5, True, None, 2**60])
def test_enable_events_bad_maxlen_writes_nothing(anyq: Any, r: redis.Redis, bad: Any) -> None:
    with pytest.raises(echomq.InvalidArgument):
        anyq.enable_events(bad)
    assert r.exists(f"emq:{{{anyq.name}}}:meta") == 0


def test_events_off_means_no_stream(q: echomq.Queue, r: redis.Redis) -> None:
    jid = q.enqueue(b"x").id
    job = q.claim()
    assert job is not None and job.id == jid
    q.complete(job.id, job.token)
    q.enqueue(b"y", delay_ms=60_000)
    assert r.exists(f"emq:{{{q.name}}}:events") == 0
    assert q.events() == []


# --------------------------------------------------------------------------- reading


def test_events_read_in_order_and_resume(anyq: Any, r: redis.Redis) -> None:
    jid = echomq.ids.mint()
    s1 = _xadd(r, anyq.name, "enqueued", jid)
    s2 = _xadd(r, anyq.name, "active", jid, attempts="1")
    s3 = _xadd(r, anyq.name, "retried", jid, attempts="1", delay_ms="500", error="<b>boom</b>")
    s4 = _xadd(r, anyq.name, "paused")
    got = anyq.events()
    assert got == [
        Event(s1, "enqueued", jid, {}),
        Event(s2, "active", jid, {"attempts": "1"}),
        Event(s3, "retried", jid, {"attempts": "1", "delay_ms": "500", "error": "<b>boom</b>"}),
        Event(s4, "paused", None, {}),
    ]
    # An event's stream id is the `after` of the next call: nothing lost, nothing repeated.
    assert [e.stream_id for e in anyq.events(after=s2)] == [s3, s4]
    assert [e.stream_id for e in anyq.events(after=s1, count=2)] == [s2, s3]
    assert anyq.events(after=s4) == []
    # A non-blocking read of "$" can only be empty.
    assert anyq.events(after="$") == []


def test_events_block_until_one_arrives(q: echomq.Queue, r: redis.Redis) -> None:
    jid = echomq.ids.mint()

    def add_once_blocked() -> None:
        # After the reader blocks: an entry added before "$" is read would never be seen
        # (a 0.3 s timer raced a slow start of the read on a busy machine, issue 36).
        wait_for(lambda: blocked_clients(r, "xread") == 1)
        _xadd(r, q.name, "completed", jid)

    adder = threading.Thread(target=add_once_blocked)
    adder.start()
    try:
        # Woken by the entry: a block that ran out would return nothing.
        got = q.events(after="$", block_ms=25_000)  # the most it takes
    finally:
        adder.join(60)
    assert [(e.event, e.id) for e in got] == [("completed", jid)]
    # A block that times out is an empty list, not an error.
    assert q.events(after=got[0].stream_id, block_ms=50) == []


async def test_async_events_block(aq: echomq.AsyncQueue, r: redis.Redis) -> None:
    sid = _xadd(r, aq.name, "enqueued", echomq.ids.mint())
    got = await aq.events(after="0", block_ms=100)
    assert [e.stream_id for e in got] == [sid]
    assert await aq.events(after=sid, block_ms=50) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"after": "abc"},
        {"after": 0},
        {"after": "1-2-3"},
        {"after": ""},
        {"count": 0},
        {"count": "5"},
        {"block_ms": 0},
        {"block_ms": -5},
        {"block_ms": 60_000},
        {"block_ms": 1.5},
    ],
)
def test_events_bad_input(anyq: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(echomq.InvalidArgument):
        anyq.events(**kwargs)


# --------------------------------------------------------------------------- metrics


def test_metrics_empty_is_zero_filled(anyq: Any) -> None:
    assert anyq.metrics() == [0] * 60
    assert anyq.metrics("failed", minutes=5) == [0] * 5


def test_metrics_layout_written_by_the_script_snippet(anyq: Any, r: redis.Redis) -> None:
    key = f"emq:{{{anyq.name}}}:metrics:completed:data"
    now = _minute(r)
    # Two older minutes with a gap (idle minutes have no element), written as the scripts do.
    r.rpush(key, f"{now - 2}:7", f"{now - 5}:4")
    _bump(r, anyq.name, "completed", 3, now)
    _bump(r, anyq.name, "completed", 2, now)
    assert r.lrange(key, 0, -1) == [
        f"{now}:5".encode(),
        f"{now - 2}:7".encode(),
        f"{now - 5}:4".encode(),
    ]
    # Read in this minute: [5, 0, 7, 0, 0, 4, 0]; in a later one, the same shifted.
    counts = {now: 5, now - 2: 7, now - 5: 4}
    for minutes in (7, 3, 1):
        read_series(anyq, r, "completed", minutes, counts)
    assert anyq.metrics("failed", minutes=3) == [0, 0, 0]


def test_metrics_bound(q: echomq.Queue, r: redis.Redis) -> None:
    key = f"emq:{{{q.name}}}:metrics:failed:data"
    now = _minute(r)
    r.rpush(key, *[f"{now - 1 - i}:1" for i in range(_observe.METRICS_POINTS)])
    _bump(r, q.name, "failed", 1, now)
    assert r.llen(key) == _observe.METRICS_POINTS
    assert r.lindex(key, -1) == f"{now - _observe.METRICS_POINTS + 1}:1".encode()  # oldest went
    counts = {now - age: 1 for age in range(_observe.METRICS_POINTS)}
    read_series(q, r, "failed", _observe.METRICS_POINTS, counts)


def test_metrics_clock_step_back_counts_into_the_newest_minute(
    q: echomq.Queue, r: redis.Redis
) -> None:
    key = f"emq:{{{q.name}}}:metrics:completed:data"
    ahead = _minute(r) + 3
    r.rpush(key, f"{ahead}:2")
    _bump(r, q.name, "completed", 1)
    assert r.lrange(key, 0, -1) == [f"{ahead}:3".encode()]
    assert q.metrics(minutes=2) == [3, 0]


def test_decode_metrics_skips_foreign_elements() -> None:
    now_s = 100 * 60 + 5
    assert decode_metrics(now_s, [b"100:2", b"junk", b"99:x", b"98:1", b"10:9"], 3) == [2, 0, 1]


@pytest.mark.parametrize(
    "args",
    [("errors", 5), ("", 5), (None, 5), ("completed", 0), ("completed", 1441), ("failed", "5")],
)
def test_metrics_bad_input(anyq: Any, r: redis.Redis, args: tuple[Any, Any]) -> None:
    with pytest.raises(echomq.InvalidArgument):
        anyq.metrics(args[0], minutes=args[1])
    assert r.keys(f"emq:{{{anyq.name}}}:*") == []


# --------------------------------------------------------------------------- the Lua side
# The transition scripts write the stream and the series (PROTOCOL D15/D16); the full
# per-transition coverage is tests/protocol/test_events_lua.py.


def test_transitions_emit_their_events(q: echomq.Queue) -> None:
    q.enable_events(100)
    jid = q.enqueue(b"x").id
    job = q.claim()
    assert job is not None
    q.complete(job.id, job.token)
    assert [(e.event, e.id) for e in q.events()] == [
        ("enqueued", jid),
        ("active", jid),
        ("completed", jid),
    ]


def test_completions_land_in_the_series(q: echomq.Queue) -> None:
    for _ in range(5):
        q.enqueue(b"x")
    for job in q.claim_batch(5):
        q.complete(job.id, job.token)
    assert sum(q.metrics(minutes=2)) == 5


# --------------------------------------------------------------------------- EventListener


def test_listener_dispatches_and_resumes_after_restart(
    q: echomq.Queue, r: redis.Redis, tmp_path: Any
) -> None:
    from echomq.events import EventListener

    store = tmp_path / "last-id"
    jobs = [echomq.ids.mint() for _ in range(5)]
    for jid in jobs[:3]:
        _xadd(r, q.name, "completed", jid)
    _xadd(r, q.name, "dead", jobs[3], error="x")

    seen: list[tuple[str, str | None]] = []
    everything: list[str] = []
    first = EventListener(q, store=store)
    first.on("completed", lambda e: seen.append((e.event, e.id)))
    first.on("*", lambda e: everything.append(e.event))

    @first.on("dead")
    def explode(e: Event) -> None:
        raise RuntimeError("a bad callback never wedges the stream")

    assert first.poll() == 4
    assert seen == [("completed", j) for j in jobs[:3]]
    assert everything == ["completed"] * 3 + ["dead"]
    assert store.read_text() == first.last_id

    # "Restart": a new listener on the same store sees only what came after.
    _xadd(r, q.name, "completed", jobs[4])
    again: list[str | None] = []
    second = EventListener(q, store=store)
    second.on("completed", lambda e: again.append(e.id))
    assert second.poll(block_ms=100) == 1
    assert again == [jobs[4]]
    assert second.poll(block_ms=50) == 0


async def test_async_listener_with_load_and_save(aq: echomq.AsyncQueue, r: redis.Redis) -> None:
    from echomq.events import AsyncEventListener

    saved: list[str] = []
    got: list[str | None] = []
    sid = _xadd(r, aq.name, "enqueued", echomq.ids.mint())
    jid = echomq.ids.mint()
    _xadd(r, aq.name, "enqueued", jid)
    listener = AsyncEventListener(aq, load=lambda: sid, save=saved.append)

    async def on_enqueued(e: Event) -> None:
        got.append(e.id)
        listener.stop()

    listener.on("enqueued", on_enqueued)
    await listener.run()
    assert got == [jid] and saved == [listener.last_id]


def test_listener_bad_arguments(q: echomq.Queue, tmp_path: Any) -> None:
    from echomq.events import EventListener

    with pytest.raises(echomq.InvalidArgument):
        EventListener(q, store=tmp_path / "x", save=print)
    listener = EventListener(q)
    with pytest.raises(echomq.InvalidArgument):
        listener.on("")
    with pytest.raises(echomq.InvalidArgument):
        listener.on("x", 5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the CLI


def test_cli_events_prints_the_stream(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    from click.testing import CliRunner

    from echomq.cli import main

    jid = echomq.ids.mint()
    s1 = _xadd(r, q.name, "enqueued", jid)
    s2 = _xadd(r, q.name, "dead", jid, attempts="3", error="boom")
    q.enable_events()  # else the command also says (on stderr) that events are off
    res = CliRunner().invoke(main, ["--url", url, "events", q.name])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"{s1} enqueued {jid}",
        f"{s2} dead {jid} attempts=3 error=boom",
    ]
    res = CliRunner().invoke(main, ["--url", url, "events", q.name, "--after", s1])
    assert res.output.splitlines() == [f"{s2} dead {jid} attempts=3 error=boom"]
    bad = CliRunner().invoke(main, ["--url", url, "events", q.name, "--after", "nope"])
    assert bad.exit_code == 2 and "after must be" in bad.output


# --------------------------------------------------------------------------- cluster


@pytest.mark.cluster
def test_events_and_metrics_on_a_cluster(tmp_path: Any) -> None:
    from redis.cluster import RedisCluster

    from echomq.testing import EmbeddedCluster

    cluster = EmbeddedCluster(tmp_path / "cluster").start()
    try:
        rc = RedisCluster(host="127.0.0.1", port=cluster.primaries()[0].port)
        with echomq.Queue("obs-cluster", client=rc) as q:
            q.enable_events(50)
            assert rc.hget("emq:{obs-cluster}:meta", "events") == b"50"
            sid = rc.xadd("emq:{obs-cluster}:events", {"event": "paused"}).decode()
            assert q.events() == [Event(sid, "paused", None, {})]
            key = "emq:{obs-cluster}:metrics:completed:data"
            rc.eval(BUMP, 1, key, "emq:{obs-cluster}:", "completed", 4)
            assert q.metrics(minutes=3)[0] in (4, 0)  # 0 only if the minute turned meanwhile
            assert sum(q.metrics(minutes=3)) == 4
            q.disable_events()
        rc.close()
    finally:
        cluster.stop()
