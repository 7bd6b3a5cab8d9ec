"""The worker's process pool: CPU-bound sync handlers on other cores (``pool="process"``).

A worker is one process, so its sync handlers share one core through the GIL. A task with
``pool="process"`` runs each job in one of the worker's *persistent* child processes
(``Worker(pool_size=N)``, default one per CPU; started with the worker, from a
``forkserver``, ``spawn`` where there is none): no process start per job, unlike
``isolate=True``. A child imports the task's module on its first job and keeps it.

What crosses the boundary is what ``isolate`` sends: the arguments the worker itself decoded
from the payload (by the app's serializer) and the child's reply, over a pipe between the
worker and its own child; no payload bytes are unpickled, by either side.

A job waits for a free child (the worker's ``concurrency`` may exceed the pool); its
``timeout`` counts from when a child takes it. At the timeout — or when the run is cancelled
(D22), lost, or handed back — the child is killed (SIGKILL) and a new one started in its
place, so nothing keeps running and the pool keeps its size. A child that dies on its own
(a segfault, the OOM killer) fails that job (retried) and is replaced the same way.

The children ignore SIGINT and SIGTERM: a Ctrl-C or systemd's stop reaches the whole process
group, and the worker, which decides what finishes and what is handed back, stops them
itself. A child whose worker is gone exits when it next reads its pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from echomq.runtime.isolate import ChildDied, ChildTimeout, _context, _unpack, run_call, send_reply

if TYPE_CHECKING:
    from echomq._appface import TaskFace
    from echomq.context import JobContext

__all__ = ["PoolRun", "ProcessPool", "default_size"]

log = logging.getLogger("echomq.worker")
_POLL_S = 0.05  # how often a waiting run looks for a kill request


def default_size() -> int:
    """One child per CPU this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class PoolRun:
    """One job's claim on the pool: :meth:`kill` (any thread) kills the child running it."""

    def __init__(self) -> None:
        self._killed = threading.Event()
        self.pid: int | None = None  # the child that runs it, once one took it

    def kill(self) -> None:
        self._killed.set()

    @property
    def killed(self) -> bool:
        return self._killed.is_set()


class _Child:
    """One persistent child process and the worker's end of its pipe."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.conn: Connection | None = None
        self.jobs = 0

    @property
    def pid(self) -> int | None:
        proc = self.proc  # read once: the run's thread may be replacing it
        try:
            pid = None if proc is None else proc.pid
        except ValueError:  # closed
            return None
        return None if pid is None else int(pid)

    def start(self) -> None:
        mp = _context()
        mine, theirs = mp.Pipe(duplex=True)
        proc = mp.Process(  # type: ignore[attr-defined]
            target=_serve, args=(theirs,), name=f"echomq-pool-{self.index}", daemon=True
        )
        proc.start()
        theirs.close()
        self.proc, self.conn, self.jobs = proc, mine, 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def stop(self, kill: bool = False) -> None:
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                if not kill:
                    conn.send(None)  # "no more jobs": the child returns
            conn.close()
        if proc is not None:
            if kill and proc.is_alive():
                proc.kill()
            proc.join(0.5 if not kill else 5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
            with contextlib.suppress(ValueError):
                proc.close()

    def call(self, request: tuple[Any, ...], timeout: float | None, run: PoolRun) -> Any:
        """Send one job and wait for its reply; kill the child at ``timeout`` (raising
        :class:`ChildTimeout`) or when ``run`` is killed (raising :class:`ChildDied`)."""
        if not self.alive():
            self.stop(kill=True)
            self.start()
        assert self.conn is not None
        run.pid = self.pid
        self.jobs += 1
        self.conn.send(request)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if run.killed:
                self.stop(kill=True)
                raise ChildDied("the run was stopped; the pool's child was killed")
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if wait <= 0:
                self.stop(kill=True)
                raise ChildTimeout(f"the run took longer than {timeout}s; the child was killed")
            if self.conn.poll(wait):
                try:
                    reply = self.conn.recv()
                except (EOFError, OSError):
                    if self.proc is not None:
                        self.proc.join(1.0)  # it is exiting: its status says why
                    code = self.proc.exitcode if self.proc is not None else None
                    self.stop(kill=True)
                    raise ChildDied(
                        f"the pool's child exited without a result (exit code {code})"
                    ) from None
                except Exception as exc:  # a reply that does not rebuild here
                    self.stop(kill=True)
                    raise ChildDied(f"unreadable reply: {type(exc).__name__}: {exc}") from None
                return _unpack(reply)


class ProcessPool:
    """``size`` persistent children shared by the worker's ``pool="process"`` runs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._children = [_Child(i) for i in range(size)]
        self._idle: asyncio.Queue[_Child] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def pids(self) -> list[int]:
        """The children's pids now (a killed child's replacement starts on its next job)."""
        return [pid for c in self._children if (pid := c.pid) is not None]

    async def start(self, threads: ThreadPoolExecutor) -> None:
        """Start every child (in a thread: a process start blocks)."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        for c in self._children:
            await self._loop.run_in_executor(threads, c.start)
            self._idle.put_nowait(c)
        log.info("process pool: %d children (pids %s)", self.size, self.pids())

    async def run(
        self,
        task: TaskFace,
        args: list[Any],
        kwargs: dict[str, Any],
        ctx: JobContext,
        run: PoolRun,
        threads: ThreadPoolExecutor,
    ) -> Any:
        """Run one job in a free child, waiting for one; cancelling the await kills it."""
        assert self._idle is not None and self._loop is not None
        child = await self._idle.get()
        loop = self._loop
        request = (
            (task.fn.__module__, task.fn.__qualname__),
            args,
            kwargs,
            (ctx.queue, ctx.id, ctx.token, ctx.group, ctx.task, ctx.floor),
        )

        def call() -> Any:
            try:
                return child.call(request, task.timeout, run)
            finally:
                if not self._closed and not child.alive():
                    try:  # its replacement, before it takes another job
                        child.start()
                    except Exception as exc:
                        log.error("process pool: could not start a child (%s)", exc)
                self._give_back(loop, child)

        job = threads.submit(call)

        # Cancelled before its thread started (the await was cancelled while it queued):
        # call() never runs, so the child goes back from here.
        def never_ran(f: Future[Any]) -> None:
            if f.cancelled():
                self._give_back(loop, child)

        job.add_done_callback(never_ran)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            run.kill()  # a cancelled run (lost, cancelled, handed back) kills its child
            raise

    def _give_back(self, loop: asyncio.AbstractEventLoop, child: _Child) -> None:
        """From any thread: the child is free again."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker ended
            loop.call_soon_threadsafe(self._release, child)

    def _release(self, child: _Child) -> None:
        if self._idle is not None and not self._closed:
            self._idle.put_nowait(child)

    def close(self) -> None:
        """Stop every child (asked to return; killed if it does not at once)."""
        self._closed = True
        for c in self._children:
            c.stop(kill=False)


def _serve(conn: Connection) -> None:
    """A pool child: run jobs until told to stop (None) or the worker is gone (EOF)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            if request is None:
                return
            ref, args, kwargs, job = request
            send_reply(conn, run_call(ref, args, kwargs, job))
    finally:
        conn.close()
