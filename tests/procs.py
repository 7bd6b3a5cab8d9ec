"""Helpers for tests that run echomq as real processes: start ``python -m echomq ...`` with
its output in a file, and stop exactly the processes a test started (by pid, never by name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent


class Proc:
    """One ``python -m echomq`` child (or ``command``, e.g. another venv's ``echomq``); its
    stdout and stderr go to ``log``."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str],
        cwd: Path,
        log: Path,
        command: Sequence[str] | None = None,
    ) -> None:
        self.args = args
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [*(command or (sys.executable, "-m", "echomq")), *args],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stop(self) -> None:
        """SIGKILL the process if it still runs (after SIGCONT, should it be stopped)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(60)
        self._out.close()

    def __repr__(self) -> str:
        return f"<Proc {self.pid} {' '.join(self.args)}>"


class Spawner:
    """Starts echomq processes for one test and stops every one of them at teardown."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.procs: list[Proc] = []

    def env(self, **extra: str | None) -> dict[str, str]:
        """The child environment: the tests dir importable, ``ECHOMQ_URL`` the test server
        (pass ``ECHOMQ_URL=None`` to leave it unset), a HOME, cache dir and ``ECHOMQ_HOME``
        of the test's own (never the user's: conftest isolates the session, this each
        test), plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ECHOMQ_", "EMQ_TEST"))}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
        )
        own = self.tmp_path / "proc-home"
        (own / "home").mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(own / "home")
        env["XDG_CACHE_HOME"] = str(own / "cache")
        env["ECHOMQ_HOME"] = str(own / "state")
        env["ECHOMQ_CEILING_DIRS"] = os.environ.get("ECHOMQ_CEILING_DIRS", "")  # conftest's
        env["ECHOMQ_URL"] = self.url
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        command: Sequence[str] | None = None,
    ) -> Proc:
        log = self.tmp_path / f"proc-{len(self.procs)}.log"
        env = env if env is not None else self.env()
        proc = Proc(list(args), env, cwd or TESTS_DIR, log, command)
        self.procs.append(proc)
        return proc

    def worker(self, queue: str, *options: str, lease_ms: int = 30_000) -> Proc:
        """``echomq worker apps.basic:app`` on ``queue``."""
        env = self.env(EMQ_TEST_QUEUE=queue, EMQ_TEST_LEASE_MS=str(lease_ms))
        return self.start("worker", "apps.basic:app", *options, env=env)

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()


@pytest.fixture
def spawn(tmp_path: Path, url: str) -> Iterator[Spawner]:
    spawner = Spawner(tmp_path, url)
    yield spawner
    spawner.stop_all()


def wait_log(proc: Proc, needle: str, timeout: float = 60.0) -> str:
    """Wait until ``needle`` shows in the process's output; fail with the output if it exits
    or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        text = proc.text()
        if needle in text:
            return text
        if proc.popen.poll() is not None:
            raise AssertionError(
                f"{proc} exited {proc.popen.returncode} before {needle!r}:\n{text}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not in the output of {proc} in {timeout}s:\n{text}")
        time.sleep(0.02)


def pid_gone(pid: int) -> bool:
    """True when no process ``pid`` exists (a zombie counts as gone: it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())


def pids_in(directory: Path) -> list[int]:
    """Live pids (zombies excluded) that work in ``directory`` or name it on their command
    line. A redis-server rewrites its process title but runs chdir'ed into its ``--dir``,
    so its working directory gives it away."""
    root = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        inside = cwd == root or cwd.startswith(root + os.sep)
        if (inside or root in cmdline) and not pid_gone(int(entry.name)):
            found.append(int(entry.name))
    return found
