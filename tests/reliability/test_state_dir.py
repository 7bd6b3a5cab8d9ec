"""Issue 36, item 2: which ``.echomq/`` (the state dir: ``server.json``, the embedded
servers' data) a process uses. ``ECHOMQ_HOME`` wins; otherwise the nearest ``.echomq/`` at
or above the current directory, found as git finds ``.git`` (never looking in a ceiling or
above: the home directory, the filesystem root, ``ECHOMQ_CEILING_DIRS``); otherwise
``./.echomq``. Every test runs with ``tmp_path`` as a ceiling, so nothing outside it counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import echomq
from echomq.client import connect as _connect
from echomq.errors import ServerNotRunning
from echomq.server import EmbeddedServer
from procs import Spawner, wait_log


@pytest.fixture
def walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No ECHOMQ_HOME, no ECHOMQ_URL, ``tmp_path`` the ceiling and HOME elsewhere in it."""
    monkeypatch.delenv("ECHOMQ_HOME", raising=False)
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    monkeypatch.setenv("ECHOMQ_CEILING_DIRS", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def _dirs(*paths: Path) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)


def _record(state: Path, server: EmbeddedServer) -> None:
    state.mkdir(parents=True, exist_ok=True)
    info = {"pid": server.pid, "port": server.port, "url": server.url, "by": "server"}
    (state / "server.json").write_text(json.dumps(info))


def test_a_script_in_a_subdirectory_uses_the_projects_recorded_server(
    walk: Path, server: EmbeddedServer | None, monkeypatch: pytest.MonkeyPatch, qname: str
) -> None:
    """The issue's repro: a server recorded in project/.echomq, a script run from
    project/app/jobs resolved 6379 (./.echomq only); it finds the project's record now and
    really talks to that server."""
    if server is None:
        pytest.skip("needs the suite's own server process (not ECHOMQ_TEST_URL)")
    project = walk / "project"
    deep = project / "app" / "jobs"
    _dirs(deep)
    _record(project / ".echomq", server)
    monkeypatch.chdir(deep)
    assert _connect.state_dir() == project / ".echomq"
    found = _connect.resolve_url()
    assert (found.url, found.source) == (server.url, "recorded")
    assert str(project / ".echomq" / "server.json") in found.reason
    q = echomq.Queue(qname)
    try:
        assert q.enqueue(b"x").status == "enqueued"
        assert q.counts()["pending"] == 1
    finally:
        q.close()
    monkeypatch.chdir(project)  # at the project itself: the relative ./.echomq, as before
    assert _connect.state_dir() == Path(".echomq")
    assert _connect.resolve_url().url == server.url


def test_a_dead_record_above_is_reported_not_skipped(
    walk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record found above whose server is gone raises ServerNotRunning naming it, as the
    one in ./.echomq does: never a silent fallback to 6379."""
    project = walk / "project"
    _dirs(project / ".echomq", project / "sub")
    (project / ".echomq" / "server.json").write_text(
        json.dumps({"pid": 2**22 + 7, "port": 1, "url": "redis://127.0.0.1:1/0"})
    )
    monkeypatch.chdir(project / "sub")
    with pytest.raises(ServerNotRunning):
        _connect.configured()


def test_the_nearest_wins_and_echomq_home_wins_over_all(
    walk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outer, inner = walk / "a", walk / "a" / "b"
    _dirs(outer / ".echomq", inner / ".echomq", inner / "c" / "d")
    monkeypatch.chdir(inner / "c" / "d")
    assert _connect.state_dir() == inner / ".echomq"
    monkeypatch.setenv("ECHOMQ_HOME", str(walk / "elsewhere"))
    assert _connect.state_dir() == walk / "elsewhere"


def test_a_plain_file_named_echomq_is_not_a_state_dir(
    walk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dirs(walk / "p" / "q")
    (walk / "p" / ".echomq").write_text("not a directory")
    monkeypatch.chdir(walk / "p" / "q")
    assert _connect.state_dir() == Path(".echomq")


def test_the_walk_never_looks_in_a_ceiling_or_above(
    walk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The home directory is a ceiling: ~/.echomq is used from ~ itself, never from a
    project below it that has none. So is each ECHOMQ_CEILING_DIRS entry (tmp_path here:
    its own .echomq is never found from below)."""
    home = walk / "home"
    _dirs(home / ".echomq", home / "proj" / "sub", walk / ".echomq", walk / "x" / "y")
    monkeypatch.chdir(home / "proj" / "sub")
    assert _connect.state_dir() == Path(".echomq")  # none found: ./.echomq of the cwd
    monkeypatch.chdir(home)
    assert _connect.state_dir() == Path(".echomq")
    assert Path(".echomq").resolve() == (home / ".echomq").resolve()
    monkeypatch.chdir(walk / "x" / "y")
    assert _connect.state_dir() == Path(".echomq")
    # Without the ceiling the same walk finds tmp_path's.
    monkeypatch.setenv("ECHOMQ_CEILING_DIRS", str(walk.parent))
    assert _connect.state_dir() == walk / ".echomq"
    monkeypatch.setenv("ECHOMQ_CEILING_DIRS", "relative/ignored" + ":" + str(walk))
    assert _connect.state_dir() == Path(".echomq")


def test_echomq_server_started_in_a_subdirectory_reuses_the_projects(
    spawn: Spawner, tmp_path: Path
) -> None:
    """``echomq server`` in project/sub, where project/.echomq exists, records itself and
    keeps its data in the project's .echomq (one server per project), not in sub/.echomq."""
    project = tmp_path / "project"
    _dirs(project / ".echomq", project / "sub")
    env = spawn.env(ECHOMQ_URL=None, ECHOMQ_HOME=None, ECHOMQ_CEILING_DIRS=str(tmp_path))
    srv = spawn.start("server", env=env, cwd=project / "sub")
    text = wait_log(srv, "export ECHOMQ_URL=", timeout=30)
    info = json.loads((project / ".echomq" / "server.json").read_text())
    assert f"export ECHOMQ_URL={info['url']}" in text
    assert (project / ".echomq" / "server").is_dir()
    assert not (project / "sub" / ".echomq").exists()
