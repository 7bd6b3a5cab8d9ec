"""The single enqueue's replay marker (issue 28, include/admit.lua and native/cmd_enqueue.c):
the call names the client-clock second that keys its marker, so the first copy reads no
clock and a resend reads one field; the key's TTL is set by a client's calls to that key
until one has admitted (flag 'x'), then each marker there is one HSET. The guarantee is
unchanged: a resend after the job completed answers ``replayed``."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import echomq
from echomq import ids
from echomq.protocol import calls as _p
from echomq.protocol import kernel as _k
from echomq.protocol import produce as _produce
from echomq.protocol.kernel import Replay
from echomq.protocol.scripts import SCRIPTS

pytestmark = pytest.mark.executors


def K(q: str, suffix: str) -> str:
    return "emq:{" + q + "}:" + suffix


def calls(r: redis.Redis, name: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_a_plain_enqueue_leaves_no_marker_and_reads_no_clock(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """The id is the marker: a minted id due now, with the default retry_for, is sent with
    no nonce and writes nothing but the job (include/admit.lua)."""
    q.enqueue(b"warm")
    r.config_resetstat()
    got = [q.enqueue(str(i).encode()) for i in range(300)]
    assert all(e.status == "enqueued" for e in got)
    assert list(r.scan_iter(match=K(qname, "recent:*"))) == []
    assert calls(r, "time") == 0
    assert calls(r, "pexpire") == 0


def test_a_named_enqueue_reads_no_clock_and_sets_each_markers_ttl_once(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """An id the caller names may be named again by another call: it keeps a marker."""
    q.enqueue(b"warm", id=ids.mint())
    r.config_resetstat()
    got = [q.enqueue(str(i).encode(), id=ids.mint()) for i in range(300)]
    assert all(e.status == "enqueued" for e in got)
    keys = list(r.scan_iter(match=K(qname, "recent:*")))
    assert keys
    replay_ms = int(keys[0].decode().split(":")[3])
    for key in keys:  # every marker key expires: none is left without a TTL
        assert 0 < r.pttl(key) <= replay_ms + 2000, key
    assert sum(r.hlen(key) for key in keys) == 301  # one marker a call, the warm-up's too
    assert calls(r, "time") == 0  # the first copy reads no clock
    assert calls(r, "pexpireat") == 0
    # One TTL write per key: a key's first call sets it, and its reply tells this process,
    # whose later calls there write the field alone. The warm-up set its key's before the
    # count (that key is this run's too when the second and prefix match: no second write).
    assert calls(r, "pexpire") == len(keys) - 1


def lost(q: echomq.Queue, replay_ms: int = 70_000) -> tuple[Any, str]:
    """A minted enqueue whose first copy landed and whose reply was lost: (its plan, id)."""
    plan = _p.enqueue(q._k, b"x", replay_ms=replay_ms)
    first = next(plan)
    assert q._x.call(first) == "enqueued"
    jid = first.args[1]
    assert isinstance(jid, str)
    return plan, jid


def resend(q: echomq.Queue, plan: Any) -> tuple[str, echomq.Enqueued]:
    again = plan.throw(Replay(redis.ConnectionError("reply lost")))
    assert "r" in str(again.args[6]) and again.args[8] == ""  # no nonce: the id stands for it
    answer = q._x.call(again)
    with pytest.raises(StopIteration) as stop:
        plan.send(answer)
    return answer, stop.value.value


def test_a_resent_minted_enqueue_lands_once_after_complete_and_remove(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """The id is the marker: a resend finds the row, or the id retired after a completion
    or a removal of the never-claimed job; one that finds neither is the first landing."""
    plan, jid = lost(q)
    assert resend(q, plan) == ("replayed", echomq.Enqueued(jid, "enqueued"))  # the row
    plan, jid = lost(q)
    q.remove(jid)  # never claimed: retired with 0
    assert resend(q, plan) == ("replayed", echomq.Enqueued(jid, "enqueued"))
    assert not r.exists(K(qname, "job:" + jid))
    q.drain()
    plan, jid = lost(q)
    job = q.claim()
    assert job is not None and job.id == jid
    q.complete(job.id, job.token)
    assert resend(q, plan) == ("replayed", echomq.Enqueued(jid, "enqueued"))
    assert q.counts()["pending"] == 0
    # A first copy that never landed: the resend admits it.
    plan = _p.enqueue(q._k, b"lost on the way", replay_ms=70_000)
    jid = next(plan).args[1]
    assert resend(q, plan) == ("enqueued", echomq.Enqueued(str(jid), "enqueued"))
    assert q.counts()["pending"] == 1
    # Past ID_REPLAY_MS (or delayed, or named) a call keeps its nonce and marker.
    call = next(_p.enqueue(q._k, b"long", replay_ms=_produce.ID_REPLAY_MS + 1))
    assert call.args[8] != ""
    call = next(_p.enqueue(q._k, b"later", replay_ms=70_000, delay_ms=5))
    assert call.args[8] != ""


def test_id_replay_ms_is_one_number_on_every_side() -> None:
    from pathlib import Path

    root = Path(_produce.__file__).parents[1]  # src/echomq, above protocol/
    lua = (root / "lua" / "include" / "common.lua").read_text()
    c = (root.parent.parent / "native" / "emq.h").read_text()
    assert f"local ID_REPLAY_MS = {_produce.ID_REPLAY_MS}\n" in lua
    assert f"#define EMQ_ID_REPLAY_MS {_produce.ID_REPLAY_MS}\n" in c


def test_a_resend_finds_its_marker_after_the_job_completed_and_the_clock_moved(
    q: echomq.Queue, r: redis.Redis, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resend names the second its first copy named, not the clock's at the resend."""
    clock = [1_800_000_000]
    monkeypatch.setattr(_produce, "_second", lambda: clock[0])
    plan = _p.enqueue(q._k, b"x", replay_ms=60_000, id=ids.mint())
    first = next(plan)
    assert q._x.call(first) == "enqueued"  # it landed; say its reply was lost
    jid = first.args[1]
    assert isinstance(jid, str)
    job = q.claim()
    assert job is not None and job.id == jid
    q.complete(job.id, job.token)
    clock[0] += 5
    again = plan.throw(Replay(redis.ConnectionError("reply lost")))
    assert "r" in str(again.args[6])
    assert again.args[9:] == first.args[9:] == ("+opt", "second", 1_800_000_000)  # the tail
    assert q._x.call(again) == "replayed"
    with pytest.raises(StopIteration) as stop:
        plan.send("replayed")
    assert stop.value.value == echomq.Enqueued(jid, "enqueued")
    assert not r.exists(K(qname, "job:" + jid))  # never admitted twice
    assert q.counts()["pending"] == 0


def test_the_ttl_flag_goes_until_a_call_to_that_key_admitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sans-I/O: 'x' on every call to a key (second, nonce prefix) of this queue until one
    answers enqueued or scheduled; not after; again in a new second or for another key."""
    clock = [1_900_000_000]
    keys = iter(["ab", "ab", "ab", "cd", "ab"])
    monkeypatch.setattr(_produce, "_second", lambda: clock[0])
    monkeypatch.setattr(_produce, "_bucket", lambda scope, second: next(keys))
    k = _p.Keys("ttlflag")

    def send(answer: str) -> str:
        plan = _p.enqueue(k, b"x", replay_ms=70_000, id=ids.mint())
        call = next(plan)
        with pytest.raises(StopIteration):
            plan.send(answer)
        return str(call.args[6])

    assert "x" in send("duplicate")  # ab: nothing admitted, no TTL known
    assert "x" in send("enqueued")  # ab: admitted with 'x' -> the key has its TTL
    assert "x" not in send("enqueued")  # ab again, same second
    assert "x" in send("enqueued")  # cd: another key
    clock[0] += 1
    assert "x" in send("enqueued")  # ab in a new second: a new key


def test_a_call_naming_its_second_keys_the_marker_there(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    """EVAL/EMQ.ENQUEUE contract: ARGV[13] names the key's second; 'x' sets the TTL
    (replay_ms + 2 s), a call without it writes the field alone."""
    x: Any = q._x
    base, meta = K(qname, ""), K(qname, "meta")
    a, b = ids.mint(), ids.mint()

    def enq(jid: str, flags: str, nonce: str, second: int) -> Any:
        args = (base, jid, b"p", "", "now", 0, flags, 60_000, nonce, "", "simple", 0, second)
        call = _p.Call(SCRIPTS["enqueue"], (K(qname, "job:" + jid), meta), args, _k._s)
        return x.call(call)

    assert enq(a, "fx", "ab0123456789", 1_700_000_000) == "enqueued"
    key = K(qname, "recent:60000:1700000000:ab")
    assert r.hgetall(key) == {("0123456789" + a[-4:]).encode(): b"e"}
    assert 61_000 <= r.pttl(key) <= 62_000
    r.pexpire(key, 30_000)
    assert enq(b, "f", "ab9999999999", 1_700_000_000) == "enqueued"
    assert r.hlen(key) == 2 and r.pttl(key) <= 30_000  # no TTL written by that call
    assert enq(a, "fr", "ab0123456789", 1_700_000_000) == "replayed"


def test_a_second_s_calls_spread_over_one_key_per_32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nonce prefix that names a marker's key: one key for a slow producer (its TTL is
    written once, not on most calls), about one per 32 calls at a higher rate, from the
    rate of the second before at once, at most 256."""
    monkeypatch.setattr(_produce, "_rates", {})

    def prefixes(second: int, n: int) -> list[str]:
        return [_produce._bucket("scope", second) for _ in range(n)]

    assert set(prefixes(100, 32)) == {"00"}  # the first 32 of a second share one key
    used = prefixes(100, 968)  # 1,000 in that second in all
    assert {int(p, 16) for p in used} <= set(range(32)) and len(set(used)) > 16
    nxt = prefixes(101, 200)  # the second after starts at the rate of the one before
    assert len(set(nxt)) > 8
    assert {int(p, 16) for p in prefixes(102, 20_000)} <= set(range(256))
    assert set(prefixes(200, 10)) == {"00"}  # after a quiet spell: one key again
