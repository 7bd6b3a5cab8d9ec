"""The sharded queue's surface (issue 43): every verb of AsyncQueue/Queue is routed, fanned
out or refused (derived from the code), the constructor's choice and its bad input, the
refusals writing nothing, ``shards=1`` being today's queue key for key, the App's routing."""

from __future__ import annotations

import asyncio
import inspect
import re
from typing import Any

import pytest
import redis
import sharded_support
from sharded_support import N, key_for_shard, shard_queues

import echomq
from conftest import snapshot
from echomq.client.async_shardfan import AsyncShardFanout
from echomq.client.shardkit import VERBS
from echomq.client.shards import MAX_SHARDS
from echomq.client.sync_shardfan import ShardFanout

pytestmark = pytest.mark.executors

sq = sharded_support.sq  # the fixture: a ShardedQueue, or an AsyncShardedQueue adapted

_JOB = re.compile(r"JOB[0-9A-Za-z]{11}")
_NONCE = re.compile(r":[0-9a-f]{12}$")  # an enqueue's replay marker, by its nonce


def _public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("plain", "sharded", "fanout"),
    [
        (echomq.AsyncQueue, echomq.AsyncShardedQueue, AsyncShardFanout),
        (echomq.Queue, echomq.ShardedQueue, ShardFanout),
    ],
)
def test_every_verb_is_routed_fanned_out_or_refused(
    plain: type, sharded: type, fanout: type
) -> None:
    """Derived from the code: a verb added to AsyncQueue (or its bases) that the sharded
    class neither overrides nor lists as inherited, with its reason, fails here by name."""
    own = set(vars(sharded)) | set(vars(fanout))
    lifecycle = {"close": "aclose", "aclose": "aclose"}
    missing = []
    for verb in sorted(_public(plain)):
        how = VERBS.get(lifecycle.get(verb, verb))
        if how is None:
            missing.append(f"{verb}: not in shardkit.VERBS")
        elif how.startswith("inherited") and verb in own:
            missing.append(f"{verb}: listed as inherited but overridden")
        elif not how.startswith("inherited") and verb not in own:
            missing.append(f"{verb}: {how!r} but not overridden")
    assert missing == [], "\n".join(missing)
    # The table names nothing the queue lacks (but the sharded class's own verbs).
    extra = set(VERBS) - _public(plain) - {"aclose", "reshard", "shards", "propose_shards"}
    assert extra == set()
    assert {"reshard", "shards", "propose_shards"} <= _public(sharded)


def test_sharded_verbs_keep_the_plain_signatures() -> None:
    for plain, sharded in ((echomq.Queue, echomq.ShardedQueue),
                           (echomq.AsyncQueue, echomq.AsyncShardedQueue)):  # fmt: skip
        for verb in _public(plain):
            a, b = getattr(plain, verb), getattr(sharded, verb)
            if callable(a):
                assert inspect.signature(a) == inspect.signature(b), verb
                assert inspect.iscoroutinefunction(a) == inspect.iscoroutinefunction(b), verb
    assert inspect.iscoroutinefunction(echomq.AsyncShardedQueue.reshard)
    assert not inspect.iscoroutinefunction(echomq.ShardedQueue.reshard)


def test_shards_picks_the_class(url: str, qname: str, r: redis.Redis) -> None:
    for cls, sharded in ((echomq.Queue, echomq.ShardedQueue),
                         (echomq.AsyncQueue, echomq.AsyncShardedQueue)):  # fmt: skip
        assert type(cls(qname, url=url)) is cls
        assert type(cls(qname, url=url, shards=None)) is cls
        assert type(cls(qname, url=url, shards=1)) is cls
        assert type(cls(qname, url=url, shards=2)) is sharded
        assert isinstance(cls(qname, url=url, shards=N), cls)
    assert snapshot(r, qname) == {}  # constructing reads and writes nothing


@pytest.mark.parametrize("bad", [0, -1, "3", True, 2.0, MAX_SHARDS + 1, None])
def test_bad_shards_are_refused_before_any_io(
    bad: Any, url: str, qname: str, r: redis.Redis
) -> None:
    for cls in (echomq.Queue, echomq.AsyncQueue):
        if bad is None:
            with pytest.raises(echomq.InvalidArgument):
                echomq.App(url=url, shards={qname: bad})
            continue
        with pytest.raises(echomq.InvalidArgument, match="shards"):
            cls(qname, url=url, shards=bad)
        with pytest.raises(echomq.InvalidArgument, match="shards"):
            echomq.App(url=url, shards={qname: bad})
    with pytest.raises(echomq.InvalidId):
        echomq.Queue("no spaces", url=url, shards=2)
    with pytest.raises(echomq.InvalidArgument, match="at most"):
        echomq.Queue("q" * 120, url=url, shards=2)
    assert snapshot(r, qname) == {}


def test_refused_verbs_raise_shards_error_and_write_nothing(
    sq: Any, url: str, qname: str, r: redis.Redis
) -> None:
    sq.enqueue(b"x", group="g")
    names = sq.shards()
    before = {name: snapshot(r, name) for name in names}
    with pytest.raises(echomq.ShardsError, match="limit_lane"):
        sq.limit(3)
    with pytest.raises(echomq.ShardsError, match="rate_limit_lane"):
        sq.rate_limit(10, 1000)
    with pytest.raises(echomq.ShardsError, match="stream"):
        sq.events()
    with pytest.raises(echomq.ShardsError, match="drain"):
        sq.reshard(N - 1)
    assert issubclass(echomq.ShardsError, echomq.InvalidArgument)
    assert {name: snapshot(r, name) for name in names} == before
    assert sq.shards() == names  # no shrink happened
    sq.limit(None)  # clearing is not refused: it clears every shard's hand-set limit
    assert sq.get_limit() is None


def test_bad_input_to_sharded_verbs_is_typed_and_writes_nothing(sq: Any, r: redis.Redis) -> None:
    sq.enqueue(b"x")
    names = sq.shards()
    before = {name: snapshot(r, name) for name in names}
    bad_calls = [
        (echomq.PayloadTooLarge, lambda: sq.enqueue(b"x" * (17 << 20))),
        (echomq.InvalidId, lambda: sq.enqueue_many([("nope", b"x")])),
        (echomq.InvalidArgument, lambda: sq.enqueue_many(b"one payload")),
        (echomq.InvalidArgument, lambda: sq.enqueue(b"x", priority=-1)),
        (echomq.InvalidArgument, lambda: sq.claim(lease_ms=0)),
        (echomq.InvalidArgument, lambda: sq.claim_batch(0)),
        (echomq.InvalidArgument, lambda: sq.browse("nowhere")),
        (echomq.InvalidArgument, lambda: sq.browse("pending", 0)),
        (echomq.InvalidId, lambda: sq.get_job("nope")),
        (echomq.InvalidId, lambda: sq.cancel("nope")),
        (echomq.InvalidId, lambda: sq.lane_depth("bad lane")),
        (echomq.InvalidArgument, lambda: sq.promote(0)),
        (echomq.InvalidArgument, lambda: sq.keep_dead(-1)),
        (echomq.InvalidArgument, lambda: sq.reprocess_all("pending")),
        (echomq.InvalidArgument, lambda: sq.reshard(0)),
        (echomq.InvalidArgument, lambda: sq.settle(completed=[("nope",)])),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
    assert {name: snapshot(r, name) for name in names} == before


def test_bad_input_on_first_use_writes_not_even_the_layout(
    url: str, qname: str, r: redis.Redis
) -> None:
    """The layout is written at a sharded queue's first call; a call refused for its input
    is refused before that, so it writes nothing at all."""
    with echomq.Queue(qname, url=url, shards=N) as fresh:
        for exc, call in [
            (echomq.InvalidId, lambda: fresh.get_job("nope")),
            (echomq.InvalidId, lambda: fresh.result("nope")),
            (echomq.InvalidId, lambda: fresh.pause_lane("bad lane")),
            (echomq.InvalidId, lambda: fresh.dedup_holder("")),
            (echomq.InvalidArgument, lambda: fresh.enqueue(b"x", delay_ms=-1)),
            (echomq.PayloadTooLarge, lambda: fresh.enqueue(b"x" * (17 << 20))),
            (echomq.InvalidId, lambda: fresh.enqueue_many([b"a", ("nope", b"b")])),
            (echomq.InvalidArgument, lambda: fresh.claim_batch(0)),
            (echomq.InvalidArgument, lambda: fresh.browse("pending", -1)),
            (echomq.InvalidArgument, lambda: fresh.keep_completed(-1)),
            (echomq.ShardsError, lambda: fresh.limit(2)),
        ]:
            with pytest.raises(exc):
                call()
        assert snapshot(r, qname) == {}
        assert fresh.counts()["pending"] == 0  # the first good call writes the layout
        assert r.hget(f"emq:{{{qname}}}:meta", "shards") is not None


def _shape(r: redis.Redis, queue: str) -> list[tuple[str, Any]]:
    """A queue's keys with its name and the job ids taken out, each with its type and its
    fields (hashes, sets) or size: what two queues that saw the same calls share."""
    out = []
    for key, (kind, value) in snapshot(r, queue).items():
        name = _NONCE.sub(":*", _JOB.sub("JOB*", key.decode().replace(queue, "Q")))
        if kind in ("hash", "set"):
            shape: Any = sorted(_JOB.sub("JOB*", f.decode()) for f in value)
        else:
            shape = len(value)
        out.append((name, kind, shape))
    return sorted(out)


def test_shards_1_writes_the_same_keys_as_a_plain_queue(
    url: str, qname: str, r: redis.Redis
) -> None:
    a, b = qname + "-plain", qname + "-one"
    for cls in (echomq.Queue, echomq.AsyncQueue):
        assert type(cls(b, url=url, shards=1)) is cls
    with echomq.Queue(a, url=url) as plain, echomq.Queue(b, url=url, shards=1) as one:
        for q in (plain, one):
            q.enqueue(b"1")
            q.enqueue(b"2", group="g", dedup="d")
            q.enqueue_many([b"3", b"4"])
            job = q.claim()
            assert job is not None
            q.complete(job.id, job.token)
            q.pause_lane("g")
            assert q.counts()["pending"] == 3
    assert _shape(r, a) == _shape(r, b)
    assert r.hget(f"emq:{{{b}}}:meta", "shards") is None  # nothing of shards is stored


def test_app_routes_a_sharded_queue_s_tasks(url: str, qname: str, r: redis.Redis) -> None:
    app = echomq.App(url=url, shards={qname: N})
    assert app.shards == {qname: N}

    @app.task(queue=qname, name="add")
    def add(x: int) -> int:
        return x + 1

    try:
        q = app.queue(qname)
        assert isinstance(q, echomq.ShardedQueue)
        lane = key_for_shard(2, N)
        sent = [add.enqueue(i).id for i in range(40)]
        laned = add.options(group=lane).enqueue(99).id
        many = add.enqueue_many([((i,), {}) for i in range(8)])
        sent += [e.id for e in many if isinstance(e, echomq.Enqueued)]
        assert q.counts()["pending"] == 49
        with shard_queues(url, q.shards()) as shards:
            per = [s.counts()["pending"] for s in shards]
            assert sum(per) == 49 and sum(1 for n in per if n) >= 2, per
            assert shards[2].job_state(laned) == "pending"
        assert {q.get_job(i) is not None for i in sent} == {True}
    finally:
        app.close()
    assert type(echomq.App(url=url).queue(qname)) is echomq.Queue


def test_app_results_are_read_from_the_job_s_shard(url: str, qname: str) -> None:
    app = echomq.App(url=url, shards={qname: N})

    @app.task(queue=qname, name="double", keep_result_ms=60_000)
    def double(x: int) -> int:
        return 2 * x

    try:
        q = app.queue(qname)
        lane = key_for_shard(3, N)
        sent = double.options(group=lane).enqueue(21).id
        job = q.claim()
        assert job is not None and job.id == sent
        q.complete(job.id, job.token, result=app.serializer.dumps(42), keep_result_ms=60_000)
        with shard_queues(url, q.shards()) as shards:
            assert shards[3].result(sent) is not None and shards[0].result(sent) is None
        assert app.result(sent, queue=qname) == 42
        assert app.wait_result(sent, queue=qname, timeout_s=5) == 42

        async def from_asyncio() -> tuple[Any, Any]:
            try:
                got = await app.aresult(sent, queue=qname)
                return got, await app.await_result(sent, queue=qname, timeout_s=5)
            finally:
                await app.aclose()

        assert asyncio.run(from_asyncio()) == (42, 42)
    finally:
        app.close()


def _old_worker(r: redis.Redis, qname: str, *, shards: bool) -> None:
    """A live registry entry of a worker serving ``qname``: one of a release before sharded
    queues (no ``shards`` field) or of this one."""
    import json

    from echomq import ids
    from echomq.protocol import registry
    from echomq.protocol.kernel import Keys

    entry: dict[str, Any] = {
        "host": "h", "pid": 1, "supervisor": None, "queues": [qname], "concurrency": 1,
        "executor": "lua", "version": "0.6.0", "started_ms": 1, "ttl_ms": 60_000,
        "held": 0, "jobs": [],
    }  # fmt: skip
    if shards:
        entry["shards"] = 1
    call = registry.beat(Keys(qname), ids.mint("WRK"), json.dumps(entry), 60_000)
    with echomq.Queue(qname, client=r) as q:
        q._x.run(call)


def test_a_queue_whose_workers_all_serve_shard_0_only_is_not_sharded(
    url: str, r: redis.Redis, qname: str
) -> None:
    """Workers of a release before sharded queues serve shard 0 only: while every live
    worker of the queue is one, sharding it (first use, reshard, the CLI) is refused and
    nothing is stored; one worker that serves shards is enough."""
    from click.testing import CliRunner

    from echomq.cli import main

    _old_worker(r, qname, shards=False)
    with (
        echomq.Queue(qname, url=url, shards=3) as sq3,
        pytest.raises(echomq.ShardsError, match="serve shard 0 only"),
    ):
        sq3.enqueue(b"x")
    assert r.hget(f"emq:{{{qname}}}:meta", "shards") is None
    res = CliRunner().invoke(main, ["--url", url, "reshard", qname, "3", "--create"])
    assert res.exit_code != 0 and "serve shard 0 only" in res.output, res.output
    assert r.hget(f"emq:{{{qname}}}:meta", "shards") is None
    _old_worker(r, qname, shards=True)
    with echomq.Queue(qname, url=url, shards=3) as sq3:
        sq3.enqueue(b"x")
        assert len(sq3.shards()) == 3


@pytest.mark.parametrize("held", ["limit", "rate_limit"])
def test_a_queue_with_a_queue_wide_limit_is_not_sharded(
    url: str, r: redis.Redis, qname: str, held: str
) -> None:
    """A queue-wide limit or rate limit stored on a queue would bind shard 0 alone once it is
    sharded: the first layout is refused (first use, reshard, the CLI; the script checks it
    too, ``EMQSTATE limited``) and nothing is stored; cleared, the queue shards."""
    from click.testing import CliRunner

    from echomq.cli import main

    with echomq.Queue(qname, url=url) as plain:
        plain.enqueue(b"x")
        if held == "limit":
            plain.limit(4)
        else:
            plain.rate_limit(10, 1000)
        before = snapshot(r, qname)
        with pytest.raises(echomq.StateError, match=r"^EMQSTATE limited "):
            plain.propose_shards([qname, f"{qname}.shard1.7"])
        with (
            echomq.Queue(qname, url=url, shards=3) as sq3,
            pytest.raises(echomq.ShardsError, match="clear_rate_limit"),
        ):
            sq3.enqueue(b"y")
        with echomq.Queue(qname, url=url, shards=3) as sq3, pytest.raises(echomq.ShardsError):
            sq3.reshard(3)
        res = CliRunner().invoke(main, ["--url", url, "reshard", qname, "3", "--create"])
        assert res.exit_code != 0 and "queue-wide limit" in res.output, res.output
        assert snapshot(r, qname) == before
        assert r.hget(f"emq:{{{qname}}}:meta", "shards") is None
        plain.limit(None)
        plain.clear_rate_limit()
    with echomq.Queue(qname, url=url, shards=3) as sq3:
        sq3.enqueue(b"y")
        assert len(sq3.shards()) == 3
        names = sq3.shards()
    echomq.Queue(names[0], url=url).limit(2)  # a limit per shard, by hand: growth keeps it
    with echomq.Queue(qname, url=url, shards=3) as sq3:
        assert len(sq3.reshard(4)) == 4
