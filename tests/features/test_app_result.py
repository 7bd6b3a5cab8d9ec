"""Issue 36, item 4: a later request reads a job's decoded result by id alone, as Celery's
``AsyncResult(id).get()`` does: ``app.result(id, queue=)`` / ``await app.aresult(...)``
(one read), ``app.wait_result`` / ``await app.await_result`` (woken by the settle). The value
is decoded by the app's serializer (JSON and MsgPack here); the states are typed:
``ResultNotReady`` (not finished, ``.state``), ``JobFailed`` (``.error``), ``ResultNotKept``.
Each test runs a real in-process Worker on the test's own queue."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import running, wait_for
from echomq import (
    App,
    InvalidArgument,
    InvalidId,
    JobFailed,
    ResultNotKept,
    ResultNotReady,
    Worker,
    ids,
)

VALUE = {"total": 3, "items": ["a", "b"], "ok": True}


@pytest.fixture(params=["json", "msgpack"])
def app(request: pytest.FixtureRequest, url: str, qname: str) -> Iterator[App]:
    """An app with three tasks on the test's queue: ``kept`` returns VALUE and keeps it,
    ``dies`` fails for good (max_attempts=1) keeping its error, ``plain`` keeps nothing."""
    a = App(url=url, serializer=request.param)

    @a.task(queue=qname, name="kept", keep_result_ms=60_000)
    def kept(n: int) -> dict[str, Any]:
        return {**VALUE, "total": n}

    @a.task(queue=qname, name="dies", keep_result_ms=60_000, max_attempts=1)
    def dies() -> None:
        raise ValueError("no such customer")

    @a.task(queue=qname, name="plain", max_attempts=1)
    def plain() -> int:
        return 1

    yield a
    a.close()


def _later(app: App, url: str) -> App:
    """A later request's app: the same server and serializer, no task registered."""
    return App(url=url, serializer=app.serializer)


def test_result_by_id_in_every_state(app: App, url: str, qname: str) -> None:
    q = app.queue(qname)
    done = app.tasks["kept"].enqueue(3)
    failed = app.tasks["dies"].enqueue()
    plain = app.tasks["plain"].enqueue()
    waiting = app.tasks["kept"].options(delay_ms=3_600_000).enqueue(9)
    with pytest.raises(ResultNotReady) as not_ready:
        app.result(done.id)  # the only queue of the app's tasks: no queue= needed
    assert (not_ready.value.job_id, not_ready.value.state) == (done.id, "pending")
    with running(Worker(app, beat_ms=100)):
        wait_for(lambda: all(q.job_state(e.id) in ("absent", "dead") for e in (done, plain)))
        wait_for(lambda: q.job_state(failed.id) == "dead")
    later = _later(app, url)
    try:
        for reader in (app, later):
            assert reader.result(done.id, queue=qname) == VALUE
            with pytest.raises(JobFailed) as err:
                reader.result(failed.id, queue=qname)
            assert err.value.job_id == failed.id and "no such customer" in err.value.error
            with pytest.raises(ResultNotKept):
                reader.result(plain.id, queue=qname)  # completed, its task keeps nothing
            with pytest.raises(ResultNotKept):
                reader.result(ids.mint(), queue=qname)  # no such job
            with pytest.raises(ResultNotReady) as sched:
                reader.result(waiting.id, queue=qname)
            assert sched.value.state == "scheduled"
        assert later.wait_result(done.id, queue=qname, timeout_s=5) == VALUE
        with pytest.raises(JobFailed):
            later.wait_result(failed.id, queue=qname, timeout_s=5)
        with pytest.raises(InvalidArgument):
            later.result(done.id)  # no tasks: which queue is not known
        with pytest.raises(InvalidId):
            later.result("not an id!", queue=qname)
    finally:
        later.close()


def test_a_dead_job_without_a_kept_error_is_failed_too(app: App, qname: str) -> None:
    """A dead-letter whose task keeps nothing is still JobFailed while its row lives."""
    q = app.queue(qname)
    e = q.enqueue(b"not an envelope")  # undecodable: dead at its first attempt
    with running(Worker(app, beat_ms=100)):
        wait_for(lambda: q.job_state(e.id) == "dead")
    with pytest.raises(JobFailed):
        app.result(e.id)


def test_the_queue_must_be_named_when_the_apps_tasks_use_several(app: App, qname: str) -> None:
    @app.task(queue=qname + "-other", name="other")
    def other() -> None:
        return None

    with pytest.raises(InvalidArgument, match="queue="):
        app.result(ids.mint())


async def test_async_result_and_await_result(app: App, url: str, qname: str) -> None:
    later = _later(app, url)
    try:
        done = await app.tasks["kept"].aenqueue(5)
        with pytest.raises(ResultNotReady):
            await later.aresult(done.id, queue=qname)
        with running(Worker(app, beat_ms=100)):
            got = await later.await_result(done.id, queue=qname, timeout_s=30)
        assert got == {**VALUE, "total": 5}
        assert await later.aresult(done.id, queue=qname) == {**VALUE, "total": 5}
        plain = await app.tasks["plain"].aenqueue()
        with running(Worker(app, beat_ms=100)):
            for _ in range(3000):
                if await app.aqueue(qname).job_state(plain.id) == "absent":
                    break
                await asyncio.sleep(0.01)
        with pytest.raises(ResultNotKept):
            await later.aresult(plain.id, queue=qname)
    finally:
        await later.aclose()
        await app.aclose()  # the async client it opened on this loop
