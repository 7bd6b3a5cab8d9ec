"""``echomq worker -p N``: one supervisor process and N worker processes.

Each child is a whole worker — its own event loop, its own ``-c`` slots, its own connections
— so CPU-bound handlers use every core. The supervisor only starts, watches and stops them;
it never talks to the server.

Start method. On Linux the children are *forked* from the supervisor after it imported the
app once (a broken module fails once, before any child; each child starts in milliseconds
and shares the imported code's memory pages). Fork is unsafe where the process may hold
threads or runtime state that do not survive it: on macOS (system frameworks), and when the
app's import started threads (a lock held by one of them would stay held in every child
forever). There — ``threading.active_count() > 1`` after the import, any platform but Linux,
or ``ECHOMQ_START_METHOD=spawn`` — each child is *spawned* instead: a fresh
``python -m echomq worker`` with the same options that imports the app itself. The
supervisor opens no connection and no event loop before forking.

Control. Each child gets the read end of a pipe whose write end only the supervisor holds:
``s`` asks a graceful stop (the child's own SIGTERM path: claiming stops, in-flight jobs get
``--grace``, the rest are handed back), ``k`` a hard one (the child's second-signal path),
and EOF — the supervisor is gone, even SIGKILLed — is a graceful stop too, so no child
outlives its supervisor for long. Signals are forwarded through the pipe rather than
re-sent, so a child that also received the signal itself (Ctrl-C reaches the whole process
group; systemd's default ``KillMode=control-group`` signals every process) is not stopped
hard by a duplicate.

Restarts (issue 39; docs/guides/deployment.md). A child that exits while the supervisor is
not stopping is started again and the reason is logged (its exit code or signal). Each child
also holds the write end of a *report* pipe and says on it when it is ready (``r``: fenced,
registered, about to claim) and when it starts its first job (``j``). A child that did
either before dying *crashed*: it is restarted after an exponential backoff
(:data:`CRASH_BACKOFF_S` doubling up to :data:`CRASH_BACKOFF_CAP_S`; the streak restarts
once a child lives :data:`HEALTHY_S`), each crash logged, and crashes alone never make the
supervisor give up (an OOM killer taking a busy child now and then must not stop the
fleet). A child that dies having done neither failed to start (a broken deploy: its import,
its configuration, a server that refuses it), however long it took (no time window decides
it: a loaded host may take seconds to import an app): it is restarted after a backoff too,
and after :data:`MAX_FAILED_STARTS` failed starts in a row of the same child the supervisor
stops the others and exits with status 3. A child that
recycles itself (``--max-jobs-per-child``, ``--max-memory-per-child``) exits with
:data:`RECYCLED` and is replaced at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from echomq import ids
from echomq.protocol.registry import SUPERVISOR_ENV

if TYPE_CHECKING:
    import asyncio

    from echomq.hooks import Hooks
    from echomq.worker import Worker

__all__ = [
    "CONTROL_FD_ENV",
    "CRASH_BACKOFF_CAP_S",
    "CRASH_BACKOFF_S",
    "EXIT_FAILING",
    "MAX_FAILED_STARTS",
    "HEALTHY_S",
    "RECYCLED",
    "REPORT_FD_ENV",
    "Supervisor",
    "reporting",
    "start_method",
    "watch_control",
]

log = logging.getLogger("echomq.supervisor")

CONTROL_FD_ENV = "ECHOMQ_CONTROL_FD"  # a spawned child's control pipe
REPORT_FD_ENV = "ECHOMQ_REPORT_FD"  # a child's report pipe (write end): b"r" ready, b"j" a job
INDEX_ENV = "ECHOMQ_CHILD_INDEX"
RECYCLED = 75  # a child's exit status when it recycled itself (max jobs / memory)
EXIT_FAILING = 3  # the supervisor's exit status when children keep failing to start
MAX_FAILED_STARTS = 5  # failed starts in a row of one child before the supervisor gives up
_BACKOFF_BASE_S = 0.25
_BACKOFF_CAP_S = 10.0
CRASH_BACKOFF_S = 0.25  # the first restart after a crash; doubles with each crash in a row
CRASH_BACKOFF_CAP_S = 30.0
HEALTHY_S = 60.0  # a child that lived this long ends a crash streak
_POLL_S = 0.05
_HARD_DEADLINE_S = 30.0  # past --grace, a child that has not exited is SIGKILLed


def start_method() -> str:
    """``fork`` or ``spawn`` (see the module docstring)."""
    forced = os.environ.get("ECHOMQ_START_METHOD", "").strip().lower()
    if forced in ("fork", "spawn"):
        return forced
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return "spawn"
    return "fork" if threading.active_count() == 1 else "spawn"


@dataclass
class _Child:
    index: int
    pid: int = 0
    popen: subprocess.Popen[bytes] | None = None
    control: int = -1  # the write end of its control pipe (the supervisor's)
    report: int = -1  # the read end of its report pipe (the supervisor's, non-blocking)
    started: float = 0.0
    ready: bool = False  # it said it was ready (b"r")
    ran: bool = False  # it said it started a job (b"j")
    failures: int = 0  # failed starts in a row
    crashes: int = 0  # crashes in a row (a child that was ready or ran a job, then died)
    due: float = 0.0  # when to start it (monotonic); inf: not to be started again
    done: bool = False  # exited during the stop, or given up


class Supervisor:
    """Runs ``processes`` worker children until SIGTERM/SIGINT (see the module docstring).

    ``run_child(index, control_fd)`` runs one worker in a forked child and returns its exit
    status; ``spawn_argv(index)`` is the command line of a spawned one. Which is used:
    :func:`start_method`.
    """

    def __init__(
        self,
        processes: int,
        *,
        run_child: Callable[[int, int], int],
        spawn_argv: Callable[[int], Sequence[str]],
        grace_s: float,
        method: str | None = None,
    ) -> None:
        self.processes = processes
        self.id = ids.mint("SUP")
        self.method = method or start_method()
        self.grace_s = grace_s
        self._run_child = run_child
        self._spawn_argv = spawn_argv
        self._children = [_Child(i) for i in range(processes)]
        self._signals: list[int] = []
        self._handled = 0
        self._stop_deadline = float("inf")
        self.exit_code = 0

    # ------------------------------------------------------------------ children

    def _start(self, c: _Child) -> None:
        read, write = os.pipe()
        heard, says = os.pipe()  # the report pipe: the child writes, the supervisor reads
        os.set_blocking(heard, False)
        env_extra = {SUPERVISOR_ENV: self.id, INDEX_ENV: str(c.index), REPORT_FD_ENV: str(says)}
        try:
            if self.method == "fork":
                pid = os.fork()
                if pid == 0:  # the child: never returns
                    os.close(heard)
                    self._in_child(c, read, write, env_extra)
                c.pid, c.popen = pid, None
            else:
                env = dict(os.environ, **env_extra)
                env[CONTROL_FD_ENV] = str(read)
                argv = list(self._spawn_argv(c.index))
                c.popen = subprocess.Popen(argv, env=env, pass_fds=(read, says))
                c.pid = c.popen.pid
        except BaseException:
            for fd in (read, write, heard, says):
                os.close(fd)
            raise
        os.close(read)
        os.close(says)
        c.control, c.report, c.started = write, heard, time.monotonic()
        c.ready = c.ran = False
        log.info("supervisor %d: worker %d started (pid %d)", os.getpid(), c.index, c.pid)

    def _start_or_back_off(self, c: _Child) -> None:
        """Start ``c``; a start that fails here (fork or exec refused: EAGAIN, ENOMEM, a
        missing interpreter) is a failed start too."""
        try:
            self._start(c)
        except OSError as exc:
            c.failures += 1
            if c.failures >= MAX_FAILED_STARTS:
                log.error("worker %d could not be started %d times (%s); stopping",
                          c.index, c.failures, exc)  # fmt: skip
                c.done, c.due = True, float("inf")
                self.exit_code = EXIT_FAILING
                return
            delay = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** (c.failures - 1))
            c.due = time.monotonic() + delay
            log.warning("worker %d could not be started (%s); retrying in %.2fs",
                        c.index, exc, delay)  # fmt: skip

    def _in_child(self, c: _Child, read: int, write: int, env: dict[str, str]) -> None:
        code = 1
        try:
            os.close(write)
            for other in self._children:  # EOF must mean "the supervisor is gone"
                for fd in (other.control, other.report):
                    if fd >= 0:
                        os.close(fd)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            os.environ.update(env)
            code = self._run_child(c.index, read)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            logging.getLogger("echomq.worker").exception("worker %d crashed", c.index)
            code = 1
        finally:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _exited(self, c: _Child) -> int | None:
        """The child's wait status as an exit code (negative: killed by that signal), or
        None while it runs."""
        if c.popen is not None:
            return c.popen.poll()
        try:
            pid, status = os.waitpid(c.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its status is lost
            return 255
        if pid == 0:
            return None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def _tell(self, c: _Child, what: bytes) -> None:
        if c.control >= 0:
            with contextlib.suppress(OSError):  # it has exited: its pipe is closed
                os.write(c.control, what)

    def _heard(self, c: _Child) -> None:
        """Read what the child reported (all of it: a dead child's bytes stay in the pipe)."""
        while c.report >= 0:
            try:
                data = os.read(c.report, 64)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                return
            c.ready = c.ready or b"r" in data
            c.ran = c.ran or b"j" in data

    def _close(self, c: _Child) -> None:
        for fd in (c.control, c.report):
            if fd >= 0:
                os.close(fd)
        c.control = c.report = -1
        c.pid = 0
        c.popen = None

    def _reap(self, stopping: bool) -> None:
        now = time.monotonic()
        for c in self._children:
            if not c.pid:
                continue
            code = self._exited(c)
            if code is None:
                continue
            uptime = now - c.started
            why = f"killed by {_signame(-code)}" if code < 0 else f"exit status {code}"
            pid = c.pid
            self._heard(c)
            self._close(c)
            if stopping:
                c.done = True
                log.info("worker %d (pid %d) stopped (%s)", c.index, pid, why)
                continue
            if code == RECYCLED:
                c.failures, c.due = 0, now
                log.info("worker %d (pid %d) recycled itself; starting a new one", c.index, pid)
                continue
            if c.ready or c.ran:
                self._crashed(c, pid, why, uptime, now)
                continue
            c.failures += 1
            if c.failures >= MAX_FAILED_STARTS:
                log.error(
                    "worker %d failed to start %d times in a row (last: pid %d, %s after "
                    "%.1fs); stopping",
                    c.index, c.failures, pid, why, uptime,
                )  # fmt: skip
                c.done, c.due = True, float("inf")
                self.exit_code = EXIT_FAILING
                continue
            delay = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** (c.failures - 1))
            c.due = now + delay
            log.warning(
                "worker %d (pid %d) exited %.1fs after its start, before it was ready (%s); "
                "restarting in %.2fs (failed start %d of %d)",
                c.index, pid, uptime, why, delay, c.failures, MAX_FAILED_STARTS,
            )  # fmt: skip

    def _crashed(self, c: _Child, pid: int, why: str, uptime: float, now: float) -> None:
        """A child that was ready or ran a job died: a crash, never a failed start (its
        deploy works). Restart it after a backoff; never give up on crashes alone."""
        c.failures = 0
        c.crashes = 1 if uptime >= HEALTHY_S else c.crashes + 1
        delay = min(CRASH_BACKOFF_CAP_S, CRASH_BACKOFF_S * 2 ** (c.crashes - 1))
        c.due = now + delay
        did = "after running jobs" if c.ran else "after it was ready"
        log.warning(
            "worker %d (pid %d) exited %s (%s, %.1fs after its start), a crash: restarting "
            "in %.2fs (crash %d in a row)",
            c.index, pid, did, why, uptime, delay, c.crashes,
        )  # fmt: skip

    # ------------------------------------------------------------------ the loop

    def _on_signal(self, sig: int, frame: Any) -> None:
        self._signals.append(sig)

    @property
    def signalled(self) -> bool:
        """A stop signal was received (the health probes' "draining")."""
        return bool(self._signals)

    def run(self) -> int:
        """Start the children, keep them running until a signal (or until one keeps failing
        to start); returns the supervisor's exit status."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        log.info(
            "supervisor %d (%s): %d worker processes (%s)",
            os.getpid(), self.id, self.processes, self.method,
        )  # fmt: skip
        try:
            stopping = False
            while True:
                if self._handled < len(self._signals):
                    stopping = self._signal(self._signals[self._handled], stopping)
                    self._handled += 1
                if not stopping and self.exit_code:
                    stopping = self._stop(b"s")
                self._reap(stopping)
                if stopping:
                    if all(not c.pid for c in self._children):
                        return self.exit_code
                    if time.monotonic() > self._stop_deadline:
                        self._kill_all()
                else:
                    now = time.monotonic()
                    for c in self._children:
                        if not c.pid and not c.done and c.due <= now:
                            self._start_or_back_off(c)
                time.sleep(_POLL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _signal(self, sig: int, stopping: bool) -> bool:
        name = _signame(sig)
        if not stopping:
            log.info(
                "supervisor received %s: stopping %d workers (grace %.1fs)",
                name, sum(1 for c in self._children if c.pid), self.grace_s,
            )  # fmt: skip
            return self._stop(b"s")
        log.warning("second signal (%s): stopping the workers now", name)
        for c in self._children:
            self._tell(c, b"k")
        self._stop_deadline = min(self._stop_deadline, time.monotonic() + 2.0)
        return True

    def _stop(self, what: bytes) -> bool:
        for c in self._children:
            self._tell(c, what)
            c.due = float("inf")
        self._stop_deadline = time.monotonic() + self.grace_s + _HARD_DEADLINE_S
        return True

    def _kill_all(self) -> None:
        for c in self._children:
            if c.pid:
                log.error("worker %d (pid %d) did not stop in time: SIGKILL", c.index, c.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signal.SIGKILL)
        self._stop_deadline = float("inf")


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# --------------------------------------------------------------------------- in the child


def _rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc; elsewhere its peak)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Recycle:
    """Why a child stopped itself (None: it did not): read by the child at exit."""

    reason: str | None = None


def watch_control(
    loop: asyncio.AbstractEventLoop,
    worker: Worker,
    fd: int,
    *,
    max_memory: int | None = None,
    recycle: Recycle | None = None,
) -> threading.Thread:
    """In a child: a thread that reads the supervisor's pipe (``s``: stop, ``k``: exit now,
    EOF: the supervisor is gone, stop) and recycles the worker past ``max_memory`` bytes of
    resident memory (checked four times a second)."""
    state = recycle or Recycle()

    def stop(reason: str | None = None) -> None:
        if reason is not None and state.reason is None:
            state.reason = reason
            log.info("worker %d: recycling (%s)", os.getpid(), reason)
        loop.call_soon_threadsafe(worker.stop)

    def main() -> None:
        stopped = False
        while True:
            try:
                ready, _, _ = select.select([fd], [], [], 0.25)
            except (OSError, ValueError):
                return
            if ready:
                try:
                    data = os.read(fd, 1)
                except OSError:
                    data = b""
                if data == b"k":
                    log.warning("worker %d: told to stop now; leases will lapse", os.getpid())
                    logging.shutdown()
                    os._exit(128 + signal.SIGTERM)
                if data == b"s" or not data:
                    if not data:
                        log.warning("worker %d: the supervisor is gone; stopping", os.getpid())
                    stop()
                    if not data:
                        return
                    stopped = True
                continue
            if stopped:
                continue
            if max_memory is not None and (rss := _rss_bytes()) > max_memory:
                stop(f"resident memory {rss >> 20} MiB > --max-memory-per-child")
                stopped = True

    thread = threading.Thread(target=main, name="echomq-control", daemon=True)
    thread.start()
    return thread


def reporting(hooks: Hooks | None) -> Hooks | None:
    """In a supervised child: ``hooks`` plus the two reports to the supervisor (ready at
    ``on_startup``; the first job at its ``before_job``), written on the report pipe named
    by :data:`REPORT_FD_ENV` (taken out of the environment: a process the worker starts is
    not a child of the supervisor). ``hooks`` unchanged when there is no pipe."""
    from echomq.hooks import Hooks

    raw = os.environ.pop(REPORT_FD_ENV, "")
    if not raw.isdigit():
        return hooks
    fd = int(raw)
    told = {"r": False, "j": False}

    def tell(what: str) -> None:
        if not told[what]:
            told[what] = True
            with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
                os.write(fd, what.encode())

    inner = hooks or Hooks()
    return Hooks(
        on_startup=(*inner.fns("on_startup"), lambda worker: tell("r")),
        on_shutdown=inner.fns("on_shutdown"),
        before_job=(lambda job: tell("j"), *inner.fns("before_job")),
        after_job=inner.fns("after_job"),
    )


def run_child_worker(worker: Worker, fd: int, *, max_memory: int | None = None) -> int:
    """Run ``worker`` as a supervised child (its signals as usual, plus the control pipe);
    its exit status: :data:`RECYCLED` when it recycled itself, else 0. ``max_jobs`` is the
    worker's own (``Worker(max_jobs=...)``: it never claims past it); ``max_memory`` is
    watched here."""
    import asyncio

    from echomq.runtime.signals import run_with_signals

    recycle = Recycle()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        watch_control(loop, worker, fd, max_memory=max_memory, recycle=recycle)
        await run_with_signals(worker)

    asyncio.run(main())
    if recycle.reason is not None:
        return RECYCLED
    if worker.max_jobs is not None and worker.stats.claimed >= worker.max_jobs:
        return RECYCLED  # it claimed its share (Worker(max_jobs=...)) and stopped
    return 0
