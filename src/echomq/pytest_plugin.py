"""The echomq pytest plugin: one private server per test session, a fresh queue per test.

Installed with echomq and registered through the ``pytest11`` entry point ``echomq``. It only
defines fixtures, so it starts nothing until a test asks for one; ``-p no:echomq`` turns it
off. The fixtures:

- ``echomq_server`` (session): the :class:`~echomq.server.EmbeddedServer` started for the
  session from ``valkey-server``/``redis-server`` on PATH (a free loopback port, data in a
  pytest temp dir, stopped at the end); ``None`` when ``ECHOMQ_TEST_URL`` names a server.
- ``echomq_url`` (session): that server's URL (``ECHOMQ_TEST_URL`` when set).
- ``echomq_queue_name``: a queue name no other test of the session uses.
- ``echomq_app``: a fresh :class:`~echomq.App` on ``echomq_url``. At teardown the app is
  closed and every queue of its tasks, and ``echomq_queue_name``, is obliterated.

Example::

    def test_sends(echomq_app, echomq_queue_name):
        sent = []

        @echomq_app.task(queue=echomq_queue_name)
        def send(to: str) -> None:
            sent.append(to)

        send.enqueue(to="a@b.c")
        assert echomq.testing.drain(echomq_app).completed == 1
        assert sent == ["a@b.c"]
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator

import pytest

from echomq.app import App
from echomq.server import EmbeddedServer
from echomq.testing import obliterate_queues

__all__ = ["echomq_app", "echomq_queue_name", "echomq_server", "echomq_url"]

_counter = itertools.count()
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@pytest.fixture(scope="session")
def echomq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer | None]:
    """A private server for the test session (None when ``ECHOMQ_TEST_URL`` is set)."""
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield None
        return
    # No AOF, no unix socket: a throwaway server, and a temp path can exceed the 107 bytes
    # a unix socket path may have.
    srv = EmbeddedServer(
        tmp_path_factory.mktemp("echomq-server"), appendonly=False, unix_socket=False
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def echomq_url(echomq_server: EmbeddedServer | None) -> str:
    """The URL of the session's server: ``ECHOMQ_TEST_URL``, else the private one."""
    if echomq_server is None:
        return os.environ["ECHOMQ_TEST_URL"]
    return echomq_server.url


@pytest.fixture
def echomq_queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test (and this process, for parallel runs)."""
    test = _UNSAFE.sub("-", request.node.name)[:80]
    return f"t{next(_counter)}-{os.getpid()}-{test}"


@pytest.fixture
def echomq_app(echomq_url: str, echomq_queue_name: str) -> Iterator[App]:
    """A fresh app on the session's server; its queues are obliterated at teardown."""
    app = App(url=echomq_url)
    try:
        yield app
    finally:
        names = {echomq_queue_name, *app.queues()}
        app.close()
        obliterate_queues(echomq_url, sorted(names))
