"""A recorded ``echomq server`` is found from another PID namespace (issue 36, item 8).

In a container (its own PID namespace) sharing ``.echomq/`` with the server's, the recorded
pid names no process, or another one: the liveness check asked the pid and refused a running
server ("not running"). Here a client runs under ``unshare --pid --fork --mount-proc``, where
the server's pid is not visible, and must connect; a server that is gone, or another one
started on the recorded port since, is still refused there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from echomq.client import connect as _connect
from echomq.ops.records import _record_server
from echomq.server import EmbeddedServer

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        [*UNSHARE, "true"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


pytestmark = [
    pytest.mark.slow,  # two servers and two namespaces per test
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not _can_unshare(),
        reason="needs unshare --pid --mount-proc (Linux, root or CAP_SYS_ADMIN)",
    ),
]

# The client in the new namespace: the server's pid must be invisible there (else the test
# proves nothing), then it resolves the recorded server, enqueues and answers in JSON.
CLIENT = textwrap.dedent(
    """
    import json, os, sys
    import echomq
    from echomq.client import connect as _connect

    pid = int(sys.argv[1])
    out = {"pid_visible": os.path.exists(f"/proc/{pid}/cmdline")}
    try:
        out["source"] = _connect.resolve_url().source
        with echomq.Queue(sys.argv[2], retry_for=0) as q:
            out["job"] = q.enqueue(b"from another pid namespace").id
    except echomq.ServerNotRunning as exc:
        out["refused"] = str(exc)
    print(json.dumps(out))
    """
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ECHOMQ_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    return tmp_path / "state"


@pytest.fixture
def recorded(tmp_path: Path, home: Path) -> Iterator[EmbeddedServer]:
    """A private server recorded in ``home`` as ``echomq server`` records it."""
    with EmbeddedServer(tmp_path / "srv", appendonly=False) as srv:
        _record_server(srv, "server")
        yield srv


def in_namespace(pid: int, queue: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_URL"}
    proc = subprocess.run(
        [*UNSHARE, sys.executable, "-c", CLIENT, str(pid), queue],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(got, dict)
    return got


def test_a_client_in_another_pid_namespace_finds_the_recorded_server(
    recorded: EmbeddedServer, home: Path
) -> None:
    info = json.loads((home / "server.json").read_text())
    assert info["pidns"] == _connect.pid_namespace() and info["run_id"]
    got = in_namespace(recorded.pid or 0, "pidns")
    assert got["pid_visible"] is False
    assert got.get("refused") is None, got
    assert got["source"] == "recorded"
    client = redis.Redis(unix_socket_path=str(recorded.socket_path))
    try:
        assert client.exists(f"emq:{{pidns}}:job:{got['job']}") == 1
    finally:
        client.close()


def test_from_another_pid_namespace_only_the_recorded_run_counts(
    tmp_path: Path, home: Path
) -> None:
    """A stopped server is refused there too, and so is another server started on the
    recorded port (its run_id is not the recorded one)."""
    with EmbeddedServer(tmp_path / "srv", appendonly=False) as srv:
        _record_server(srv, "server")
        pid, port = srv.pid or 0, srv.port
    got = in_namespace(pid, "pidns")
    assert "is not running" in str(got.get("refused")), got
    with EmbeddedServer(tmp_path / "other", port=port, appendonly=False):
        got = in_namespace(pid, "pidns")
        assert "is not running" in str(got.get("refused")), got
