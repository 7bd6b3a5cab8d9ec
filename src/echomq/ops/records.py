"""server.json and the data-dir lock, written by ``echomq server``/worker.

The ``server.json`` writer (its reader is ``client.connect.read_record``): an ``echomq server``
or a worker's embedded server is recorded in the state dir (``client.connect.state_dir``: the
nearest ``.echomq/`` at or above the current directory, else ``./.echomq/``) so clients
started there or below find it, and a lock file keeps two servers from sharing one data
directory."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from echomq.client import connect as _connect
from echomq.server import EmbeddedServer, state_dir


def _record_server(srv: EmbeddedServer, by: str) -> Path:
    """Write ``server.json`` (atomically: a reader never sees half of it): the server's pid
    and URL for clients, ``owner`` (this process) and ``by`` for the next server here, and
    the PID namespace and the server's ``run_id`` for a reader that cannot see the pid."""
    record = state_dir() / "server.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    info = {
        "pid": srv.pid,
        "port": srv.port,
        "url": srv.url,
        "socket": str(srv.socket_path),
        "owner": os.getpid(),
        "by": by,
        # For a reader in another PID namespace (a container), to which the pid means
        # nothing: it asks the server for its run_id instead (client.locate._live).
        "pidns": _connect.pid_namespace(),
        "run_id": _connect.run_id(str(srv.socket_path), srv.url),
    }
    partial = record.with_name(f".server.json.{os.getpid()}")
    partial.write_text(json.dumps(info))
    partial.replace(record)
    return record


def _unrecord(record: Path, srv: EmbeddedServer) -> None:
    """Delete ``record`` only while it is still ours: a server started here since owns it."""
    info = _connect.read_record(record.parent) or {}
    if info.get("owner") == os.getpid() and info.get("pid") == srv.pid:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()


def _hold_lock(path: Path) -> Any:
    """An exclusive lock on ``path`` held for this process's life (the open file; the OS
    lets go when the process ends, however it ends), with our pid written in it; None when
    another process holds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - held open until exit, on purpose
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def _lock_holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"
