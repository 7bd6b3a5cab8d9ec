"""Fixtures: real redis-server processes started and stopped by the tests themselves.

The session server runs on a free port in a temp dir (``ECHOMQ_TEST_URL`` points the suite
at another server instead). Each test gets a unique queue name, never a FLUSHALL, and a
SCRIPT FLUSH so the NOSCRIPT -> EVAL path runs all the time.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

import echomq
from echomq.server import EmbeddedServer

# procs.py holds the subprocess helpers and the `spawn` fixture every process test uses;
# pytester runs a user's test file against echomq's own pytest plugin (test_testing_helpers).
pytest_plugins = ["procs", "pytester"]

_counter = itertools.count()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer | None]:
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield None
        return
    srv = EmbeddedServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def url(server: EmbeddedServer | None) -> str:
    return os.environ.get("ECHOMQ_TEST_URL") or (server.url if server else "")


@pytest.fixture
def r(url: str) -> Iterator[redis.Redis]:
    """A raw client for asserting wire state (bytes replies)."""
    client = redis.Redis.from_url(url)
    client.script_flush()
    yield client
    client.close()


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"t{next(_counter)}-{os.getpid()}-{name}"


@pytest.fixture
def q(url: str, qname: str, r: redis.Redis) -> Iterator[echomq.Queue]:
    queue = echomq.Queue(qname, url=url)
    yield queue
    queue.close()


@pytest.fixture
async def aq(url: str, qname: str, r: redis.Redis) -> AsyncIterator[echomq.AsyncQueue]:
    queue = echomq.AsyncQueue(qname, url=url)
    yield queue
    await queue.aclose()


@pytest.fixture(params=["sync", "async"])
def anyq(request: pytest.FixtureRequest, url: str, qname: str, r: redis.Redis) -> Iterator[Any]:
    """The same test on Queue and on AsyncQueue (driven through a small sync adapter)."""
    if request.param == "sync":
        queue = echomq.Queue(qname, url=url)
        yield queue
        queue.close()
    else:
        adapter = SyncOverAsync(echomq.AsyncQueue(qname, url=url))
        yield adapter
        adapter.close()


class SyncOverAsync:
    """Runs every AsyncQueue verb to completion on a private loop, so one test body covers
    both classes. Only used by tests."""

    def __init__(self, aq: echomq.AsyncQueue) -> None:
        import asyncio

        self._aq = aq
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._aq, name)
        if not callable(attr):
            return attr

        def run(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(attr(*args, **kwargs))

        return run

    def close(self) -> None:
        self._loop.run_until_complete(self._aq.aclose())
        self._loop.close()


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``pred`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def snapshot(r: redis.Redis, queue: str) -> dict[bytes, Any]:
    """Every key of the queue with its type and full content (for 'nothing written' tests)."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000)):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = ("hash", r.hgetall(key))
        elif kind == b"zset":
            out[key] = ("zset", r.zrange(key, 0, -1, withscores=True))
        elif kind == b"list":
            out[key] = ("list", r.lrange(key, 0, -1))
        elif kind == b"set":
            out[key] = ("set", r.smembers(key))
        else:
            out[key] = (kind, r.dump(key))
    return out


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def tmp_server(path: Path, **kw: Any) -> EmbeddedServer:
    return EmbeddedServer(path, **kw).start()
