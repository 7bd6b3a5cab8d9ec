"""Bad input outside the verb table: payload limits, queue names, constructor arguments
(max_payload, url and client, decoding clients) and settle/retry_for arguments.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from bad_input_support import (
    ABSENT,
    LANE,
    Case,
    populate,
)

import echomq
from conftest import SyncOverAsync, snapshot
from echomq import ids
from echomq.errors import (
    InvalidArgument,
    InvalidId,
    PayloadTooLarge,
)

# Every test that reaches a server runs on both executors (tests/conftest.py).
pytestmark = pytest.mark.executors


@pytest.fixture(params=["sync", "async"])
def smallq(
    request: pytest.FixtureRequest, url: str, qname: str, r: redis.Redis
) -> Iterator[tuple[Any, dict[str, Any]]]:
    if request.param == "sync":
        queue: Any = echomq.Queue(qname, url=url, max_payload=1024)
    else:
        queue = SyncOverAsync(echomq.AsyncQueue(qname, url=url, max_payload=1024))
    jobs = populate(queue)
    before = snapshot(r, qname)
    yield queue, jobs
    assert snapshot(r, qname) == before
    assert queue.check() == []
    queue.close()


BIG = b"x" * 1025


SMALL = b"x" * 1024


PAYLOAD_CASES: list[tuple[str, Case]] = [
    ("enqueue", lambda q, j: q.enqueue(BIG)),
    ("enqueue-str", lambda q, j: q.enqueue("x" * 1025)),
    # 513 characters, 1026 bytes once UTF-8 encoded: measured in bytes.
    ("enqueue-utf8", lambda q, j: q.enqueue("\u00e9" * 513)),
    ("enqueue-bytearray", lambda q, j: q.enqueue(bytearray(BIG))),
    ("enqueue-lane", lambda q, j: q.enqueue(BIG, group=LANE)),
    ("enqueue-delayed", lambda q, j: q.enqueue(BIG, delay_ms=10)),
    ("enqueue-id", lambda q, j: q.enqueue(BIG, id=ABSENT)),
    ("many-first", lambda q, j: q.enqueue_many([BIG, SMALL])),
    ("many-last", lambda q, j: q.enqueue_many([SMALL, b"a", b"b", BIG])),
    ("many-pair", lambda q, j: q.enqueue_many([SMALL, (ABSENT, BIG)])),
    ("many-lane", lambda q, j: q.enqueue_many([SMALL, BIG], group=LANE)),
    ("complete-result", lambda q, j: q.complete(j["active"], j["token"], result=BIG)),
]


@pytest.mark.parametrize(("label", "call"), PAYLOAD_CASES, ids=[c[0] for c in PAYLOAD_CASES])
def test_payload_too_large(smallq: tuple[Any, dict[str, Any]], label: str, call: Case) -> None:
    q, jobs = smallq
    with pytest.raises(PayloadTooLarge) as info:
        call(q, jobs)
    assert info.value.limit == 1024
    assert info.value.size > 1024


def test_payload_at_the_limit_is_accepted(url: str, qname: str, r: redis.Redis) -> None:
    with echomq.Queue(qname, url=url, max_payload=1024) as q:
        e = q.enqueue(SMALL)
        assert e.status == "enqueued"
        assert q.get_job(e.id)["payload"] == SMALL
        assert [v.status for v in q.enqueue_many([SMALL, "\u00e9" * 512])] == [
            "enqueued",
            "enqueued",
        ]


BAD_QUEUE_NAMES: list[Any] = [
    "",
    "emq",
    "x" * 129,
    "a b",
    "a{b}",
    "{a}",
    "a:b",
    "a*b",
    "caf\u00e9",
    None,
    123,
    b"orders",
]


@pytest.mark.parametrize("name", BAD_QUEUE_NAMES, ids=repr)
def test_bad_queue_names(url: str, name: Any) -> None:
    with pytest.raises(InvalidId):
        echomq.Queue(name, url=url)
    with pytest.raises(InvalidId):
        echomq.AsyncQueue(name, url=url)


def test_longest_queue_name_is_legal(url: str, r: redis.Redis) -> None:
    name = "q" * 127 + "1"
    with echomq.Queue(name, url=url) as q:
        e = q.enqueue(b"x")
        assert r.exists("emq:{" + name + "}:job:" + e.id) == 1
        q.remove(e.id)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1024", None])
def test_bad_max_payload(url: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        echomq.Queue("ok", url=url, max_payload=bad)
    with pytest.raises(InvalidArgument):
        echomq.AsyncQueue("ok", url=url, max_payload=bad)


def test_url_and_client_together(url: str) -> None:
    client = redis.Redis.from_url(url)
    aclient = redis.asyncio.Redis.from_url(url)
    try:
        with pytest.raises(InvalidArgument):
            echomq.Queue("ok", url=url, client=client)
        with pytest.raises(InvalidArgument):
            echomq.AsyncQueue("ok", url=url, client=aclient)
    finally:
        client.close()
        asyncio.run(aclient.aclose())


def test_decoding_clients_are_refused(url: str) -> None:
    # Payloads are bytes: a client that decodes replies would corrupt them.
    client = redis.Redis.from_url(url, decode_responses=True)
    aclient = redis.asyncio.Redis.from_url(url, decode_responses=True)
    try:
        with pytest.raises(InvalidArgument):
            echomq.Queue("ok", client=client)
        with pytest.raises(InvalidArgument):
            echomq.AsyncQueue("ok", client=aclient)
    finally:
        client.close()
        asyncio.run(aclient.aclose())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"completed": [("not-an-id", 1)]},
        {"completed": [(ids.mint(), 0)]},
        {"completed": [(ids.mint(),)]},
        {"retried": [(ids.mint(), 1, -1, 3, "e")]},
        {"retried": [(ids.mint(), 1, 0, 0, "e")]},
        {"retried": [(ids.mint(), 1, 0, 3)]},
        {"retried": [(ids.mint(), 1, 0, 3, 7)]},
        {"n": -1},
        {"lease_ms": 0},
    ],
)
def test_settle_rejects_bad_input_before_any_write(
    anyq: Any, r: redis.Redis, qname: str, kwargs: dict[str, Any]
) -> None:
    anyq.enqueue(b"x")
    before = snapshot(r, qname)
    with pytest.raises((InvalidId, InvalidArgument)):
        anyq.settle(**kwargs)
    assert snapshot(r, qname) == before


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "10", True])
def test_retry_for_is_validated(url: str, value: Any) -> None:
    with pytest.raises(InvalidArgument):
        echomq.Queue("q", url=url, retry_for=value)
    with pytest.raises(InvalidArgument):
        echomq.AsyncQueue("q", url=url, retry_for=value)
