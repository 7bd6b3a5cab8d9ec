"""Earlier releases of echomq, built from their git tags (no network): ``git archive vX.Y.Z
src`` into a directory, run with ``PYTHONPATH`` in a subprocess of this venv's python. A
missing tag fails the test (a shallow clone without tags cannot check the upgrade path)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from echomq.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent


def build(tag: str, into: Path) -> Path:
    """``into/src`` holding release ``tag``'s package (built once per directory)."""
    src = into / "src"
    if not (src / "echomq" / "__init__.py").exists():
        into.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", tag, "src"], capture_output=True, check=False
        )
        if archive.returncode != 0:
            raise AssertionError(f"cannot build {tag} from its tag: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return src


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
