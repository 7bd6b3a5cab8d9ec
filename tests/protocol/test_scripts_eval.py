"""The scripts called by raw EVAL against a server, without the client: each verb's
keys and arguments, server clock, pause, retry ceiling, check and replay markers.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from scripts_contract_support import (
    LANE,
)

from conftest import server_ms
from echomq import ids, keyspace
from echomq.protocol.scripts import (
    SCRIPTS,
)


def _k(q: str, suffix: str) -> str:
    return keyspace.queue_key(q, suffix)


def _eval(r: redis.Redis, name: str, keys: list[str], args: list[Any]) -> Any:
    return r.eval(SCRIPTS[name].source, len(keys), *keys, *args)


def _row(r: redis.Redis, key: str) -> dict[str, bytes]:
    return {f.decode(): v for f, v in r.hgetall(key).items()}


def test_eval_enqueue_then_claim_then_complete(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    reply = _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"p\r\n\x00", "", "now", 0])
    assert reply == b"enqueued"
    assert _row(r, jk) == {"state": b"pending", "attempts": b"0", "payload": b"p\r\n\x00"}
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert r.lrange(_k(qname, "ring"), 0, -1) == [b"*"]
    assert r.lrange(_k(qname, "wake"), 0, -1) == [b"1"]

    t0 = server_ms(r)
    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    reply = _eval(r, "claim", keys, [base, 5000])
    t1 = server_ms(r)
    assert reply == [jid.encode(), b"p\r\n\x00", 1, None]
    assert _row(r, jk)["state"] == b"active"
    assert _row(r, jk)["attempts"] == b"1"
    score = r.zscore(_k(qname, "active"), jid)
    assert score is not None and t0 + 5000 <= score <= t1 + 5000
    assert r.zcard(_k(qname, "pending")) == 0
    assert r.llen(_k(qname, "ring")) == 0

    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE complete token mismatch"):
        _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "2", ""])
    assert r.exists(jk) == 1
    r.rpush(jk + ":logs", "a line")
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "1", ""]) == 1
    assert r.exists(jk, jk + ":logs") == 0
    assert r.zcard(_k(qname, "active")) == 0
    assert r.hget(_k(qname, "metrics:completed"), "count") == b"1"
    # A second complete answers gone (0), never stale.
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, "1", ""]) == 0


def test_eval_enqueue_refuses_kind_and_writes_nothing(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    oid = ids.mint("ORD")
    jk = _k(qname, "job:" + oid)
    with pytest.raises(redis.ResponseError, match=r"^EMQKIND job id must be JOB-namespaced"):
        _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, oid, b"x", "", "now", 0])
    assert list(r.scan_iter(match=f"emq:{{{qname}}}:*")) == []


def test_eval_enqueue_in_uses_the_server_clock(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    t0 = server_ms(r)
    reply = _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "in", 60_000])
    t1 = server_ms(r)
    assert reply == b"scheduled"
    score = r.zscore(_k(qname, "schedule"), jid)
    assert score is not None and t0 + 60_000 <= score <= t1 + 60_000
    assert _row(r, jk)["state"] == b"scheduled"
    assert r.exists(_k(qname, "pending"), _k(qname, "ring")) == 0


def test_eval_lane_enqueue_and_claim(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    lane = _k(qname, f"g:{LANE}:pending")
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", LANE, "now", 0]) == (
        b"enqueued"
    )
    assert _row(r, jk)["group"] == LANE.encode()
    assert r.zscore(lane, jid) == 0
    assert r.smembers(_k(qname, "lanes")) == {LANE.encode()}
    assert r.lrange(_k(qname, "ring"), 0, -1) == [LANE.encode()]
    assert r.exists(_k(qname, "pending")) == 0

    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    reply = _eval(r, "claim", keys, [base, 1000])
    assert reply == [jid.encode(), b"x", 1, LANE.encode()]
    assert r.hget(_k(qname, "gactive"), LANE) == b"1"
    assert r.exists(lane, _k(qname, "lanes"), _k(qname, "ring")) == 0


def test_eval_claim_reads_pause_inside(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    r.hset(_k(qname, "meta"), "paused", "1")
    keys = [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")]
    assert _eval(r, "claim", keys, [base, 1000]) == []
    assert _eval(r, "claim_batch", keys, [base, 1000, 5]) == []
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert _row(r, jk)["attempts"] == b"0"
    r.hdel(_k(qname, "meta"), "paused")
    assert _eval(r, "claim", keys, [base, 1000])[0] == jid.encode()


def test_eval_retry_at_ceiling_is_dead(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 1000])
    keys = [_k(qname, "active"), _k(qname, "schedule"), _k(qname, "dead"), jk]
    assert _eval(r, "retry", keys, [base, jid, "1", 0, 1, "boom"]) == b"dead"
    assert _row(r, jk) == {
        "state": b"dead",
        "attempts": b"1",
        "payload": b"x",
        "last_error": b"boom",
    }
    assert (r.zscore(_k(qname, "dead"), jid) or 0) > 0  # its time of death (D25)
    assert r.zcard(_k(qname, "active")) == 0
    assert r.hget(_k(qname, "metrics:failed"), "count") == b"1"
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE retry lease settled"):
        _eval(r, "retry", keys, [base, jid, "1", 0, 1, "again"])


def test_eval_retry_schedules_on_the_server_clock(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 1000])
    keys = [_k(qname, "active"), _k(qname, "schedule"), _k(qname, "dead"), jk]
    t0 = server_ms(r)
    assert _eval(r, "retry", keys, [base, jid, "1", 7000, 3, "boom"]) == b"scheduled"
    t1 = server_ms(r)
    score = r.zscore(_k(qname, "schedule"), jid)
    assert score is not None and t0 + 7000 <= score <= t1 + 7000
    assert _row(r, jk)["state"] == b"scheduled"
    assert _row(r, jk)["last_error"] == b"boom"


def test_eval_reap_returns_lapsed_lease(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 60_000])
    assert _eval(r, "reap", [_k(qname, "active")], [base, 100]) == 0
    r.zadd(_k(qname, "active"), {jid: server_ms(r) - 1})  # the lease lapsed
    assert _eval(r, "reap", [_k(qname, "active")], [base, 100]) == 1
    assert _row(r, jk)["state"] == b"pending"
    assert _row(r, jk)["attempts"] == b"1"  # the next claim mints token 2
    assert r.zscore(_k(qname, "pending"), jid) == 0
    assert r.zcard(_k(qname, "active")) == 0
    assert r.lrange(_k(qname, "ring"), 0, -1) == [b"*"]


def test_eval_extend_sets_server_clock_lease(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")
    jid = ids.mint()
    jk = _k(qname, "job:" + jid)
    _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0])
    _eval(r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 100])
    t0 = server_ms(r)
    assert _eval(r, "extend", [_k(qname, "active"), jk], [base, jid, "1", 90_000]) == 1
    t1 = server_ms(r)
    score = r.zscore(_k(qname, "active"), jid)
    assert score is not None and t0 + 90_000 <= score <= t1 + 90_000
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE extend token mismatch"):
        _eval(r, "extend", [_k(qname, "active"), jk], [base, jid, "0", 90_000])
    gone = _k(qname, "job:" + ids.mint())
    assert _eval(r, "extend", [_k(qname, "active"), gone], [base, "x", "1", 1000]) == 0


def test_eval_check_reports_planted_violations(r: redis.Redis, qname: str) -> None:
    base = _k(qname, "")

    def section(name: str, where: str = "", pos: int = 0) -> list[str]:
        lines, _, _ = _eval(r, "check", [_k(qname, "meta")], [base, name, where, pos, 1000])
        return [v.decode() for v in lines]

    def rows() -> list[str]:
        # A SCAN section covers the database page by page: follow the cursor to its end.
        out, cursor = [], "0"
        while True:
            lines, cursor, _ = _eval(
                r, "check", [_k(qname, "meta")], [base, "rows", cursor, 0, 1000]
            )
            out += [v.decode() for v in lines]
            cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
            if cursor == "0":
                return out

    def everything() -> list[str]:
        return [*section("core"), *section("members", "pending"), *rows(), *section("ring")]

    assert everything() == []
    ghost = ids.mint()
    r.zadd(_k(qname, "pending"), {ghost: 0})
    orphan = ids.mint()
    r.hset(_k(qname, "job:" + orphan), mapping={"state": "pending", "attempts": "0"})
    out = everything()
    assert any(ghost in v and "ghost" in v for v in out)
    assert any(orphan in v and "no set" in v for v in out)
    assert any("ring misses the flat set" in v for v in out)
    with pytest.raises(redis.ResponseError, match="unknown section"):
        section("everything")


def test_eval_replay_markers_first_copy_writes_and_only_a_resend_reads(
    r: redis.Redis, qname: str
) -> None:
    """A single enqueue's marker is one field of the per-second HASH
    recent:<replay_ms>:<second>:<nonce[:2]>; a call that names no second (ARGV[13]) gets the
    server's, and sets the key's TTL, replay_ms + 2 s. Only a copy flagged 'r' looks for it;
    a fresh call of the same id is a new job."""
    base, jid, nonce = _k(qname, ""), ids.mint(), "ab0123456789"
    jk = _k(qname, "job:" + jid)
    args = [base, jid, b"x", "", "now", 0, "f", 60_000, nonce]
    t0 = server_ms(r)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], args) == b"enqueued"
    (key,) = list(r.scan_iter(match=base + "recent:*"))
    second = int(key.decode().split(":")[-2])
    assert key.decode() == f"{base}recent:60000:{second}:ab" and second in (
        t0 // 1000,
        t0 // 1000 + 1,
    )
    assert r.hgetall(key) == {("0123456789" + jid[-4:]).encode(): b"e"}
    assert 61_000 <= r.pttl(key) <= 62_000
    # A second first copy (no 'r') never reads markers: the row answers duplicate.
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], args) == b"duplicate"
    job = _eval(
        r, "claim", [_k(qname, "meta"), _k(qname, "ring"), _k(qname, "active")], [base, 5000]
    )
    assert _eval(r, "complete", [_k(qname, "active"), jk], [base, jid, str(job[2]), ""]) == 1
    # The resend after the job completed: replayed, nothing admitted.
    resend = [base, jid, b"x", "", "now", 0, "fr", 60_000, nonce]
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], resend) == b"replayed"
    assert r.exists(jk) == 0
    # A resend of a call that never landed (another nonce): admitted.
    other = [base, jid, b"y", "", "now", 0, "r", 60_000, "cd0123456789"]
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], other) == b"enqueued"
    assert _row(r, jk)["attempts"] == b"1"  # not minted ('f' absent): continues its count


def test_eval_enqueue_many_leaves_one_marker_a_call(r: redis.Redis, qname: str) -> None:
    base, a, b = _k(qname, ""), ids.mint(), ids.mint()
    head = [base, "", "now", 0, 60_000, "ef0123456789"]
    pairs = [a, b"1", b, b"2", "ORD" + a[3:], b"3"]
    assert _eval(r, "enqueue_many", [_k(qname, "meta")], [*head, "f", 0, "", *pairs]) == [
        b"enqueued",
        b"enqueued",
        b"kind",
    ]
    assert r.get(base + "recent:ef0123456789") == b"eek"
    assert 59_000 <= r.pttl(base + "recent:ef0123456789") <= 61_000
    r.delete(_k(qname, "job:" + a))  # as if it completed
    assert _eval(r, "enqueue_many", [_k(qname, "meta")], [*head, "fr", 0, "", *pairs]) == [
        b"replayed",
        b"replayed",
        b"kind",
    ]
    assert r.exists(_k(qname, "job:" + a)) == 0  # never admitted twice
    # A call that admits nothing leaves no marker.
    head2 = [base, "", "now", 0, 60_000, "aa0123456789"]
    again = _eval(r, "enqueue_many", [_k(qname, "meta")], [*head2, "", 0, "", b, b"x"])
    assert again == [b"duplicate"]
    assert r.exists(base + "recent:aa0123456789") == 0


def test_eval_a_minted_id_skips_the_retired_record(r: redis.Redis, qname: str) -> None:
    base, jid = _k(qname, ""), ids.mint()
    jk = _k(qname, "job:" + jid)
    r.hset(base + "retired", jid, 7)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0, "f"]) == (
        b"enqueued"
    )
    assert _row(r, jk)["attempts"] == b"0"  # 'f': minted in this call, never handed out
    r.delete(jk)
    assert _eval(r, "enqueue", [jk, _k(qname, "meta")], [base, jid, b"x", "", "now", 0, ""]) == (
        b"enqueued"
    )
    assert _row(r, jk)["attempts"] == b"7" and _row(r, jk)["floor"] == b"7"
    assert r.hexists(base + "retired", jid) is False
