"""A private ``valkey-server``/``redis-server`` process: the embedded server and test fixture.

With no URL configured, ``echomq server``, ``demo`` and ``worker`` start one of these (unix
socket + loopback port, AOF on, data in the state dir: the nearest ``.echomq/`` at or above
the current directory, else ``./.echomq/``) and stop it when done. The test
suite starts its servers with the same class, so there is one way to run a server here (a
cluster of them for tests: :class:`echomq.testing.EmbeddedCluster`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from echomq.client import connect as _connect

__all__ = [
    "EmbeddedServer",
    "NoServerBinary",
    "ServerStartError",
    "configured_url",
    "find_binary",
    "free_port",
    "recorded_url",
    "state_dir",
]

INSTALL_HINT = (
    "no valkey-server or redis-server on PATH; install one "
    "(Debian/Ubuntu: sudo apt-get install -y redis-server; macOS: brew install valkey) "
    "or set ECHOMQ_URL to a running server"
)


class NoServerBinary(FileNotFoundError):
    """Neither ``valkey-server`` nor ``redis-server`` is on PATH (nor ``ECHOMQ_SERVER_BIN``).

    Not a :class:`ServerStartError`: nothing was started, so a caller that retries a refused
    start another way (without a module) must not take this for one."""

    def __init__(self, message: str = INSTALL_HINT) -> None:
        super().__init__(message)


class ServerStartError(RuntimeError):
    """The server binary ran but the server did not come up: it exited (a module it would
    not load, a port taken, a bad argument; the message has its last log lines) or did not
    answer PING in time."""


def find_binary() -> str:
    """The server binary to run: ``ECHOMQ_SERVER_BIN``, else valkey-server, else redis-server."""
    env = os.environ.get("ECHOMQ_SERVER_BIN")
    if env:
        found = shutil.which(env)
        if found is None:
            raise NoServerBinary(f"ECHOMQ_SERVER_BIN={env!r} is not an executable; " + INSTALL_HINT)
        return found
    for name in ("valkey-server", "redis-server"):
        path = shutil.which(name)
        if path:
            return path
    raise NoServerBinary()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, cluster: bool = False) -> int:
    """A loopback TCP port that was free a moment ago. ``cluster=True`` picks one at most
    55535 whose cluster bus port (+10000) is free too."""
    if not cluster:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(20000, 55535)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


try:  # loaded here, in the parent: the child between fork and exec only calls prctl
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM the server when its parent dies, so a
    crashed owner never leaves a server behind (no-op elsewhere)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _file_id(path: Path) -> tuple[int, int, int] | None:
    """Which file ``path`` is now: device, inode and change time (a file made since may
    reuse a deleted one's inode number)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _ping(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-LOADING"))
    except OSError:
        return False


class EmbeddedServer:
    """One server process that this object starts and stops (by its own pid, never others).

    Args:
        dir: data directory (created); the AOF and the unix socket live here.
        port: TCP port on 127.0.0.1; a free one when None.
        appendonly: AOF on (``appendfsync everysec`` unless ``fsync`` says otherwise).
        unix_socket: also listen on ``<dir>/server.sock``.
        args: extra ``--name value`` arguments (cluster mode, ``--loadmodule``, TLS ...).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        appendonly: bool = True,
        fsync: str = "everysec",
        unix_socket: bool = True,
        args: Sequence[str] = (),
        binary: str | None = None,
        logfile: bool = True,
        die_with_parent: bool = True,
    ) -> None:
        self.dir = Path(dir).resolve()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.fsync = fsync
        self.unix_socket = unix_socket
        self.args = list(args)
        self.binary = binary
        self.logfile = logfile
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self._socket_id: tuple[int, int, int] | None = None  # _file_id of our socket file

    @property
    def socket_path(self) -> Path:
        return self.dir / "server.sock"

    @property
    def url(self) -> str:
        """The TCP URL of the server (db 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [
            self.binary or find_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.fsync,
            "--daemonize", "no",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        if self.unix_socket:
            cmd += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        if self.logfile:
            cmd += ["--logfile", str(self.dir / "server.log")]
        return cmd + self.args

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the process and wait until it answers PING."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()  # a restart: the previous process's pipe
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, not the server
            # Only a prctl call runs between fork and exec (libc is loaded in the parent).
            preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = self.dir / "server.log"
                if log.exists():
                    err += log.read_text(errors="replace")[-2000:]
                raise ServerStartError(f"server exited with {self.proc.returncode}: {err.strip()}")
            if _ping("127.0.0.1", self.port):
                self._socket_id = _file_id(self.socket_path) if self.unix_socket else None
                return self
            time.sleep(0.02)
        self.stop()
        raise ServerStartError(f"server on port {self.port} did not answer PING in {timeout}s")

    def kill(self) -> None:
        """SIGKILL the server (a crash, for tests); the data directory stays."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM our own process and wait; SIGKILL it if it does not go."""
        proc = self.proc
        if proc is None:
            return
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            # The server refuses a SIGTERM while it writes its first AOF (a replica right
            # after its sync does) and does not retry it: sent again, it is taken as soon as
            # the write ends, not at the deadline's SIGKILL.
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            if proc.poll() is None and time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()
        # Only the socket file our server made: another server that took the path since
        # (started on the same directory) keeps its own.
        if self._socket_id is not None and _file_id(self.socket_path) == self._socket_id:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._socket_id = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def state_dir() -> Path:
    """Where the embedded server keeps its data and ``echomq server`` records itself:
    ``ECHOMQ_HOME``, else the nearest ``.echomq/`` at or above the current directory, else
    ``./.echomq`` (see :func:`echomq.client.connect.state_dir`)."""
    return _connect.state_dir()


def _pid_alive(pid: int) -> bool:
    return _connect.pid_alive(pid)


def recorded_url(directory: Path | None = None) -> str | None:
    """The URL of a live ``echomq server`` recorded in the state dir, if one is running
    (:func:`echomq.client.connect.recorded_url`: the record read, its pid checked, no network)."""
    return _connect.recorded_url(directory)


def configured_url(explicit: str | None) -> str | None:
    """The server the user configured: an explicit URL, ``ECHOMQ_URL``, or a running
    ``echomq server`` recorded in the state dir; None when nothing is configured (the
    order of :func:`echomq.client.connect.resolve_url`)."""
    found = _connect.configured(explicit)
    return found.url if found is not None else None
