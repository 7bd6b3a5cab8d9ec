"""The job option ``keep_logs`` (BullMQ's ``keepLogs``, issue 38): a job keeps its newest N
log lines; ``add_log`` without a ``keep`` of its own trims to the row's N, an explicit one
wins. Its lifecycle (PROTOCOL §2.4): a reprocess keeps it, a re-admission of the id takes the
new call's, a debounce fold takes the newest call's, a remove deletes it with the row. Both
executors, real servers."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import echomq
from echomq import ids
from echomq.errors import InvalidArgument

pytestmark = pytest.mark.executors


def _row(r: redis.Redis, qname: str, jid: str) -> dict[bytes, bytes]:
    return r.hgetall(f"emq:{{{qname}}}:job:{jid}")


def _log(q: Any, jid: str, n: int) -> list[int]:
    return [q.add_log(jid, f"l{i}") for i in range(n)]


def test_add_log_trims_to_the_jobs_keep_logs(anyq: Any) -> None:
    jid = anyq.enqueue(b"x", keep_logs=2).id
    assert _log(anyq, jid, 4) == [1, 2, 2, 2]
    assert anyq.logs(jid) == [b"l2", b"l3"]
    # An explicit keep wins over the row's, either way (0: every line).
    assert anyq.add_log(jid, "big", keep=3) == 3
    assert anyq.add_log(jid, "all", keep=0) == 4
    assert anyq.logs(jid) == [b"l2", b"l3", b"big", b"all"]
    assert anyq.add_log(jid, "row") == 2
    assert anyq.logs(jid) == [b"all", b"row"]
    assert anyq.check() == []


def test_unset_keeps_every_line_and_writes_no_field(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    plain = q.enqueue(b"x").id
    kept = q.enqueue(b"x", keep_logs=3).id
    assert b"keep_logs" not in _row(r, qname, plain)
    assert _row(r, qname, kept)[b"keep_logs"] == b"3"
    assert _log(q, plain, 5) == [1, 2, 3, 4, 5]
    big = q.enqueue(b"x", keep_logs=10**15 - 1).id
    assert _row(r, qname, big)[b"keep_logs"] == b"999999999999999"
    assert _log(q, big, 2) == [1, 2]


def test_enqueue_many_and_task_options(
    q: echomq.Queue, r: redis.Redis, qname: str, url: str
) -> None:
    many = q.enqueue_many([b"a", b"b"], keep_logs=1, priority=3)
    for e in many:
        assert _row(r, qname, e.id)[b"keep_logs"] == b"1"
        assert _log(q, e.id, 3) == [1, 1, 1]
    app = echomq.App(url=url)
    try:

        @app.task(queue=qname, name="noop")
        def noop() -> None:
            return None

        jid = noop.options(keep_logs=2).enqueue().id
        assert _row(r, qname, jid)[b"keep_logs"] == b"2"
        ids = noop.enqueue_many([((), {})], keep_logs=4)
        assert _row(r, qname, ids[0].id)[b"keep_logs"] == b"4"  # type: ignore[union-attr]
    finally:
        app.close()


@pytest.mark.parametrize("bad", [0, -1, 10**15, 1.5, True, "3"])
def test_bad_keep_logs_writes_nothing(q: echomq.Queue, r: redis.Redis, bad: object) -> None:
    before = sorted(r.keys("*"))
    with pytest.raises(InvalidArgument):
        q.enqueue(b"x", keep_logs=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        q.enqueue_many([b"x"], keep_logs=bad)  # type: ignore[arg-type]
    assert sorted(r.keys("*")) == before


def test_reprocess_keeps_it_and_remove_deletes_it(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    jid = q.enqueue(b"x", keep_logs=2, id=ids.encode("JOB", 41)).id
    job = q.claim(lease_ms=60_000)
    assert job is not None and job.id == jid
    assert q.retry(jid, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    q.reprocess(jid)
    assert _row(r, qname, jid)[b"keep_logs"] == b"2"
    assert _log(q, jid, 3) == [1, 2, 2]
    q.remove(jid)
    assert _row(r, qname, jid) == {}
    # Re-admitting the id: the new call's options, here none.
    again = q.enqueue(b"y", id=jid)
    assert again.status == "enqueued"
    assert b"keep_logs" not in _row(r, qname, jid)
    assert q.add_log(jid, "a") == 1 and q.add_log(jid, "b") == 2 and q.add_log(jid, "c") == 3


def test_debounce_fold_takes_the_newest_calls_keep_logs(
    q: echomq.Queue, r: redis.Redis, qname: str
) -> None:
    d = {"dedup": "kl", "dedup_mode": "debounce", "dedup_ttl_ms": 60_000, "delay_ms": 60_000}
    holder = q.enqueue(b"v1", keep_logs=2, **d).id  # type: ignore[arg-type]
    assert _row(r, qname, holder)[b"keep_logs"] == b"2"
    q.enqueue(b"v2", keep_logs=5, **d)  # type: ignore[arg-type]
    assert _row(r, qname, holder)[b"keep_logs"] == b"5"
    q.enqueue(b"v3", **d)  # type: ignore[arg-type]
    assert b"keep_logs" not in _row(r, qname, holder)
    q.enqueue(b"v4", keep_logs=1, **d)  # type: ignore[arg-type]
    assert _row(r, qname, holder)[b"keep_logs"] == b"1"
    assert q.check() == []
