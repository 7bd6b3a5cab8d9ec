"""Batches from async code: an async producer, an async handler adding siblings, typed
bad input and resends beside a sync producer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from batches_support import (
    _app,
    _drain,
    _keys,
)

import echomq
from echomq.tasks import batches as _batches

pytestmark = pytest.mark.executors


async def _until(pred: Any, timeout: float = 60.0) -> Any:
    """Await ``pred()`` until it is truthy (a generous deadline, never a fixed wait)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not (value := await pred()):
        assert time.monotonic() < deadline, f"condition not met within {timeout}s"
        await asyncio.sleep(0.02)
    return value


@contextlib.contextmanager
def _serving(app: echomq.App) -> Iterator[None]:
    """An in-process worker of ``app`` on a loop of its own (conftest's ``running``), then
    the asyncio client its ``async def`` handlers opened on that loop closed there."""
    import asyncio
    import threading

    worker = echomq.Worker(app, beat_ms=100)

    async def serve() -> None:
        try:
            await worker.arun()
        finally:
            await app.aclose()  # the handlers' client, on the loop that opened it

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(60)
        loop.close()


def _async_app(url: str, qname: str) -> tuple[echomq.App, dict[str, Any], list[str]]:
    """Tasks for the asyncio tests, run by an in-process worker: ``amember`` (async) adds
    ``spawn`` siblings to its own batch through ``await current_job().abatch()``; ``acb``
    (async) records ``<tag>:<its batch id>`` in the returned list."""
    from echomq import current_job

    app = echomq.App(url=url)
    log: list[str] = []

    @app.task(queue=qname, name="amember")
    async def amember(n: int, spawn: int = 0) -> int:
        log.append(f"run:{n}")
        if spawn:
            ctx = current_job()
            assert ctx is not None
            batch = await ctx.abatch()
            assert batch is not None
            await batch.aadd_many([amember.s(n * 100 + i) for i in range(spawn - 1)])
            await batch.aadd(amember.s(n * 100 + spawn - 1))
        return n

    @app.task(queue=qname, name="acb")
    async def acb(tag: str) -> None:
        ctx = current_job()
        assert ctx is not None
        batch = await ctx.abatch()
        log.append(f"{tag}:{batch.id if batch else '-'}")

    return app, {"member": amember, "cb": acb}, log


async def test_an_async_producer_opens_adds_closes_and_reads(url: str, qname: str) -> None:
    app, t, log = _async_app(url, qname)
    try:
        b = await app.abatch(
            on_complete=t["cb"].s("complete"),
            on_success=t["cb"].s("success"),
            on_death=t["cb"].s("death"),
            description="async",
        )
        members = await b.aadd_many([t["member"].s(i) for i in range(3)])
        members.append(await b.aadd(t["member"].s(3)))
        assert len(set(members)) == 4
        st = await b.astatus()
        assert (st.total, st.pending, st.closed, st.description) == (4, 4, False, "async")
        with _serving(app):
            # Open: the members settle, nothing fires before the close.
            await _until(lambda: _settled(b, 4))
        assert not [x for x in log if not x.startswith("run:")]
        assert await b.aclose() is True
        assert await b.aclose() is False
        st = await b.astatus()
        assert (st.total, st.succeeded, st.dead, st.pending) == (4, 4, 0, 0)
        assert (st.closed, st.complete, st.success, st.first_death) == (True, True, True, None)
        with _serving(app):
            await _until(lambda: _logged(log, 2, app, qname))
        assert sorted(x for x in log if not x.startswith("run:")) == [
            f"complete:{b.id}",
            f"success:{b.id}",
        ]
        assert sorted(x for x in log if x.startswith("run:")) == [f"run:{i}" for i in range(4)]
        with pytest.raises(echomq.StateError, match="nobatch"):
            await b.astatus()  # on_complete ran: the batch is gone
        assert await app.aqueue(qname).check() == []
    finally:
        await app.aclose()


async def _settled(b: echomq.Batch, n: int) -> bool:
    st = await b.astatus()
    return st.succeeded == n and st.pending == 0


async def _logged(log: list[str], callbacks: int, app: echomq.App, qname: str) -> bool:
    fired = [x for x in log if not x.startswith("run:")]
    c = await app.aqueue(qname).counts()
    idle = c.get("pending", 0) == c.get("active", 0) == c.get("scheduled", 0) == 0
    return len(fired) >= callbacks and idle


async def test_an_async_handler_adds_siblings_to_its_batch(url: str, qname: str) -> None:
    """Members (async def) add to their own batch after the producer closed it, through
    ``await current_job().abatch()``: the batch waits for them and on_complete fires once."""
    app, t, log = _async_app(url, qname)
    try:
        b = await app.abatch(on_complete=t["cb"].s("complete"), on_success=t["cb"].s("success"))
        await b.aadd_many([t["member"].s(n, spawn=2) for n in (1, 2)])
        await b.aclose()
        with _serving(app):
            await _until(lambda: _logged(log, 2, app, qname))
        runs = sorted(int(x[4:]) for x in log if x.startswith("run:"))
        assert runs == [1, 2, 100, 101, 200, 201]
        assert sorted(x for x in log if not x.startswith("run:")) == [
            f"complete:{b.id}",
            f"success:{b.id}",
        ]
        assert await app.aqueue(qname).check() == []
    finally:
        await app.aclose()


async def test_async_bad_input_is_typed_and_writes_nothing(
    url: str, qname: str, r: redis.Redis
) -> None:
    app, t = _app(url, qname)
    other = echomq.App(url=url)

    @other.task(queue=qname + "-other", name="elsewhere")
    def elsewhere() -> None:
        return None

    try:
        before = _keys(r, qname)
        with pytest.raises(echomq.InvalidArgument):
            await app.abatch(on_complete="not a signature")  # type: ignore[arg-type]
        with pytest.raises(echomq.InvalidArgument):
            await app.abatch()
        with pytest.raises(echomq.InvalidArgument):
            await app.abatch(on_complete=t["cb"].s("x"), on_death=elsewhere.s())
        with pytest.raises(echomq.InvalidArgument):
            await app.abatch(on_complete=t["cb"].s("x"), description=3)  # type: ignore[arg-type]
        assert _keys(r, qname) == before
        b = await app.abatch(on_complete=t["cb"].s("x"))
        before = _keys(r, qname)
        with pytest.raises(echomq.InvalidArgument):
            await b.aadd("not a signature")  # type: ignore[arg-type]
        with pytest.raises(echomq.InvalidArgument):
            await b.aadd(elsewhere.s())
        with pytest.raises(echomq.InvalidArgument):
            await b.aadd_many("not an iterable of signatures")
        with pytest.raises(echomq.InvalidArgument):
            await b.aadd_many([t["member"].s(1), "nope"])
        with pytest.raises(echomq.InvalidArgument):
            await b.astatus(failed_limit=-1)
        with pytest.raises(echomq.InvalidId):
            await app.abatch_of_job("not an id!", queue=qname)
        unknown = app.batch_by_id(echomq.ids.mint(), queue=qname)
        with pytest.raises(echomq.StateError, match="nobatch"):
            await unknown.aadd(t["member"].s(1))
        with pytest.raises(echomq.StateError, match="nobatch"):
            await unknown.aclose()
        with pytest.raises(echomq.StateError, match="nobatch"):
            await unknown.astatus()
        assert _keys(r, qname) == before
        await b.aadd(t["member"].s(0))
        await b.aclose()
        before = _keys(r, qname)
        with pytest.raises(echomq.StateError, match="closed"):
            await b.aadd(t["member"].s(1))
        assert _keys(r, qname) == before
        # A job outside any batch has none; the anchor and a member have this one.
        plain = t["member"].enqueue(7).id
        assert await app.abatch_of_job(plain, queue=qname) is None
        assert (await app.abatch_of_job(b.id, queue=qname)).id == b.id  # type: ignore[union-attr]
    finally:
        await app.aclose()
        other.close()


async def test_async_resend_counts_once_beside_a_sync_producer(
    url: str, qname: str, r: redis.Redis
) -> None:
    """An async add resent after a lost reply answers its first verdicts (counted once),
    and a sync producer and an async one add to the same batch."""
    app, t = _app(url, qname)
    try:
        b = await app.abatch(on_complete=t["cb"].s("complete"))
        aq = app.aqueue(qname)
        call = next(_batches.add(aq._k, None, b.id, [t["member"].s(1), t["member"].s(2)], ""))
        first = await aq._x.run(call)
        _drain(app.queue(qname))  # the members complete before the resend arrives
        again = await aq._x.run(call)
        assert [str(v) for v in first] == ["enqueued", "enqueued"]
        assert [str(v) for v in again] == ["replayed", "replayed"]
        app.batch_by_id(b.id, queue=qname).add(t["member"].s(3))  # another producer, sync
        st = await b.astatus()
        assert (st.total, st.succeeded, st.pending) == (3, 2, 1)
        assert await b.aclose() is True
        seen = _drain(app.queue(qname))
        assert [j.id for j in seen][-1] == b.id  # the last member's settle released on_complete
        with pytest.raises(echomq.StateError, match="nobatch"):
            await b.astatus()
    finally:
        await app.aclose()
