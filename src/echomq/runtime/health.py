"""The worker's /livez and /readyz (``--health-port``), a supervisor's too.

Health probes of a worker process (``echomq worker --health-port P``) and of the
supervisor of ``-p N``: ``/livez`` and ``/readyz`` over plain HTTP (stdlib only).

Liveness cannot be judged by the loop it judges: a blocked event loop answers nothing. So the
loop only *stamps* — a task of the worker's loop writes ``time.monotonic()`` every
:data:`STAMP_S` — and an independent thread (the HTTP server's) compares the stamp's age to
the bound (``--live-bound``, default :data:`LIVE_BOUND_S`). A loop that stops turning over
(a handler calling ``time.sleep`` on it, a deadlock, a C call holding it) goes red within the
bound. The body also names each handler *past its lease without heartbeats*: a run whose
lease was last extended (or, if never, first seen) longer than its lease ago — the heartbeat
could not reach the server, or the loop that sends it is blocked; the stall sweep will give
that job to another worker. It is reported, not fatal: the protocol recovers the job.

Readiness: the worker is connected (its last call went through), passed the version fence,
and is not draining (SIGTERM received: 503 at once, before the grace period starts).

Under ``-p N`` each child stamps a small JSON file of its own (``ECHOMQ_HEALTH_DIR``,
``<index>.json``, replaced atomically every stamp) instead of serving; the supervisor serves
the probes from those files: live while every child's stamp is within the bound, ready while
every child is ready and the supervisor has received no stop signal. ``time.monotonic`` is
one clock for every process of the machine (CLOCK_MONOTONIC), so a child's stamp compares
with the supervisor's now.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from echomq.runtime.queueloop import QueueLoop

__all__ = [
    "HEALTH_DIR_ENV",
    "LIVE_BOUND_S",
    "STAMP_S",
    "FleetHealth",
    "Probe",
    "WorkerHealth",
    "serve",
]

HEALTH_DIR_ENV = "ECHOMQ_HEALTH_DIR"  # a supervised child's directory for its state file
LIVE_BOUND_S = 30.0  # /livez: the longest the event loop may go without turning over
STAMP_S = 1.0  # how often the loop stamps (and a child writes its file)

Verdict = tuple[bool, dict[str, Any]]


class Probe(Protocol):
    def live(self) -> Verdict: ...

    def ready(self) -> Verdict: ...


class WatchedWorker(Protocol):
    """What the probes read of the worker they watch (``echomq.worker.Worker``; named by this
    Protocol so that the worker, which builds its probes, is not imported back here)."""

    @property
    def _loops(self) -> list[QueueLoop]: ...
    @property
    def _stopping(self) -> bool: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def _down_since(self) -> float | None: ...


class WorkerHealth:
    """One worker process's health: the worker calls :meth:`attach` from its event loop
    (``Worker.health``); the probes read it from any thread. ``state_file``: a supervised
    child's file (see the module docstring), written on each stamp."""

    def __init__(self, live_bound_s: float = LIVE_BOUND_S, state_file: Path | None = None):
        self.bound = live_bound_s
        self.created = time.monotonic()
        self.stamp: float | None = None
        self.worker: WatchedWorker | None = None
        self._file = state_file
        self._task: asyncio.Future[None] | None = None
        # When each run was first seen (by the stamping task): a run never extended since.
        self._first_seen: dict[tuple[str, str, int], float] = {}

    def attach(self, worker: WatchedWorker) -> None:
        """From ``Worker.arun``, on its loop: start stamping."""
        self.worker = worker
        self.stamp = time.monotonic()
        self._task = asyncio.ensure_future(self._stamping())

    async def _stamping(self) -> None:
        while True:
            self.stamp = now = time.monotonic()
            self._note_runs(now)
            if self._file is not None:
                self._write()
            await asyncio.sleep(STAMP_S)

    def _note_runs(self, now: float) -> None:
        seen: dict[tuple[str, str, int], float] = {}
        for ql in list(self.worker._loops) if self.worker is not None else []:
            for key in list(ql.inflight):
                full = (ql.keys.name, *key)
                seen[full] = self._first_seen.get(full, now)
        self._first_seen = seen

    def overdue(self, now: float | None = None) -> list[dict[str, Any]]:
        """The runs past their lease without a heartbeat (any thread may ask)."""
        w = self.worker
        if w is None:
            return []
        now = time.monotonic() if now is None else now
        fallback = self.stamp if self.stamp is not None else now
        out: list[dict[str, Any]] = []
        for ql in list(w._loops):
            lease = ql.lease_ms / 1000
            for key, r in list(ql.inflight.items()):
                if r.lost:
                    continue
                held = max(self._first_seen.get((ql.keys.name, *key), fallback), ql.extended_at)
                past = now - held - lease
                if past > 0:
                    task = r.ctx.task if r.ctx is not None else None
                    out.append(
                        {"queue": ql.keys.name, "job": key[0], "task": task,
                         "past_lease_s": round(past, 3)}
                    )  # fmt: skip
        return out

    def live(self) -> Verdict:
        now = time.monotonic()
        age = now - (self.stamp if self.stamp is not None else self.created)
        ok = age <= self.bound
        body: dict[str, Any] = {
            "status": "ok" if ok else "stalled",
            "loop_age_s": round(age, 3),
            "bound_s": self.bound,
            "past_lease": self.overdue(now),
        }
        if not ok:
            body["reason"] = f"the event loop has not turned over for {age:.1f}s"
        return ok, body

    def ready(self) -> Verdict:
        alive, _ = self.live()
        reason = self._not_ready() if alive else "the event loop is stalled"
        if reason is None:
            return True, {"status": "ready"}
        return False, {"status": "not ready", "reason": reason}

    def _not_ready(self) -> str | None:
        w = self.worker
        if w is None:
            return "starting"
        if w._stopping:
            return "draining: stopping (SIGTERM received)"
        if not w.fenced:
            return "connecting: the version fence has not passed yet"
        if w._down_since is not None:
            return f"server unreachable for {time.monotonic() - w._down_since:.1f}s"
        return None

    def _write(self) -> None:
        assert self._file is not None
        ok, body = self.ready()
        state = {
            "pid": os.getpid(),
            "stamp": self.stamp,
            "ready": ok,
            "reason": body.get("reason"),
            "past_lease": self.overdue(),
        }
        tmp = self._file.with_name(f".{self._file.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self._file)
        except OSError:  # a full disk: the stamp goes stale and /livez says so
            with contextlib.suppress(OSError):
                tmp.unlink()


class FleetHealth:
    """The supervisor's probes, from its children's state files (module docstring)."""

    def __init__(
        self,
        directory: Path,
        processes: int,
        live_bound_s: float = LIVE_BOUND_S,
        *,
        stopping: Callable[[], bool],
    ) -> None:
        self.dir = directory
        self.processes = processes
        self.bound = live_bound_s
        self.created = time.monotonic()
        self._stopping = stopping

    def _states(self) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for i in range(self.processes):
            try:
                out.append(json.loads((self.dir / f"{i}.json").read_text()))
            except (OSError, ValueError):
                out.append(None)  # not written yet (a child starting)
        return out

    def live(self) -> Verdict:
        now = time.monotonic()
        children: list[dict[str, Any]] = []
        stalled: list[str] = []
        past: list[dict[str, Any]] = []
        for i, s in enumerate(self._states()):
            stamp = s.get("stamp") if s else None
            age = now - (stamp if isinstance(stamp, (int, float)) else self.created)
            children.append({"index": i, "pid": s.get("pid") if s else None,
                             "loop_age_s": round(age, 3)})  # fmt: skip
            if age > self.bound:
                stalled.append(f"worker {i}: the event loop has not turned over for {age:.1f}s")
            for run in (s or {}).get("past_lease") or []:
                past.append({"worker": i, **run})
        ok = not stalled
        body: dict[str, Any] = {
            "status": "ok" if ok else "stalled",
            "bound_s": self.bound,
            "workers": children,
            "past_lease": past,
        }
        if stalled:
            body["reason"] = "; ".join(stalled)
        return ok, body

    def ready(self) -> Verdict:
        if self._stopping():
            return False, {"status": "not ready", "reason": "draining: stopping (signal received)"}
        alive, live_body = self.live()
        if not alive:
            return False, {"status": "not ready", "reason": live_body["reason"]}
        reasons = []
        for i, s in enumerate(self._states()):
            if s is None:
                reasons.append(f"worker {i}: starting")
            elif not s.get("ready"):
                reasons.append(f"worker {i}: {s.get('reason')}")
        if reasons:
            return False, {"status": "not ready", "reason": "; ".join(reasons)}
        return True, {"status": "ready", "workers": self.processes}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/livez":
            ok, body = self.server.probe.live()
        elif path == "/readyz":
            ok, body = self.server.probe.ready()
        else:
            ok, body = False, {"error": "not found: /livez and /readyz are served"}
            self._send(404, body)
            return
        self._send(200 if ok else 503, body)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not worth a log line


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    probe: Probe


def serve(probe: Probe, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``probe`` on ``host:port`` from a daemon thread; ``shutdown()`` stops it. A port
    that cannot be bound raises ``OSError`` here, before any work starts."""
    server = _Server((host, port), _Handler)
    server.probe = probe
    threading.Thread(target=server.serve_forever, name="echomq-health", daemon=True).start()
    return server
