"""Running earlier releases of echomq beside this one: each is materialised from its git
tag by ``tests/upgrade/release.py`` (no network; a missing tag fails the test, never skips)
and run in a subprocess of this venv's python with its ``src`` first on ``PYTHONPATH``; and
a server of a test's own, for tests of the deployment-wide keys."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from release import materialise

from echomq.server import EmbeddedServer


def build(tag: str, into: Path) -> Path:
    """The ``src`` directory of release ``tag``, materialised under ``into``."""
    return materialise(tag, into).src


def _env(src: Path) -> dict[str, str]:
    # A test leg's ECHOMQ_EXECUTOR=native is not passed on: an older release needs its own
    # module version (0.5 refuses trafikey 3 when told "native"; on "auto" it runs Lua).
    env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_EXECUTOR"}
    env["PYTHONPATH"] = str(src)
    return env


def run(src: Path, code: str, *args: str, timeout: float = 120.0) -> str:
    """Run ``code`` (a Python program; ``sys.argv[1:]`` = ``args``) with the release at
    ``src`` as ``echomq``; its stdout. A failure fails the test with its output."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=src.parent,
        env=_env(src),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"release at {src} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def start(src: Path, code: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start ``code`` with the release at ``src`` in the background (output in ``log``)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            cwd=src.parent,
            env=_env(src),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def own_server(
    request: pytest.FixtureRequest, leg: str, where: Path
) -> Iterator[tuple[str, redis.Redis]]:
    """A fresh server of one test's own (the layout and the migrations are deployment-wide),
    with trafikey loaded on the native leg: its echomq URL (``?executor=<leg>``) and a raw
    client."""
    args: list[str] = []
    if leg == "native":
        args = ["--loadmodule", str(request.getfixturevalue("module_so"))]
    srv = EmbeddedServer(where, appendonly=False, args=args).start()
    raw = redis.Redis.from_url(srv.url)
    try:
        yield f"{srv.url}?executor={leg}", raw
    finally:
        raw.close()
        srv.stop()
