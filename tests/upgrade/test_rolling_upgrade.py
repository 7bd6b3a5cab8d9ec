"""The upgrade contract, tested release against release (issue 39): release N-1 and this tree
run side by side through a rolling upgrade, and every acknowledged job runs exactly once.

What it runs, on one server (the session's; on the native leg one that loads N-1's module,
so N-1 runs the EMQ.* commands and N, whose client needs another module version, Lua):

1. N-1 creates the queues (a lane limit; a queue-wide limit and kept history on the
   children's queue). Two N-1 workers and one N worker serve them (``echomq worker -c 6``, each
   release's own CLI); two N-1 and two N producers make every kind of call N-1 has (flat,
   lanes, delayed, dedup keys shared by all, kept results, retries to dead, flows across two
   queues, ``enqueue_many``; the workers fire a repeat) through a loopback proxy that drops
   replies (the command ran, its reply is lost, the producer resends). Mid-run an N-1
   worker is SIGKILLed and replaced by an N one, then an N worker is.
2. The retired record under resends: N-1 stages 28,000 no-op jobs in a paused lane and
   fills the queue's retired record close to a generation (24,000 ids). An N producer's
   enqueue lands and its reply is lost; the proxy holds its resend while the job completes
   and an N-1 batch worker completes the 28,000 (``apps.upgrade_churn``: enough to rotate
   0.4's count-only record twice), then lets the resend through, within the producer's
   ``retry_for``. It must be answered ``replayed``, not admitted again.
3. The last N-1 worker is SIGKILLed and replaced; the queues drain.

Then: every acknowledged job ran; no lease generation (id, token) ran twice and no run had
a ``floor`` above 0 (either is a second admission of one acknowledged call); the repeat
fired exactly its limit; the jobs sent to die are dead; kept results read back; ``check()``
of N-1 and of N is clean on both queues, and so is the raw checker (tests/reliability.py).

Run another pair (not part of CI; a tag or ``tree`` on either side)::

    ECHOMQ_TEST_UPGRADE_FROM=v0.4.0 ECHOMQ_TEST_UPGRADE_TO=v0.5.0 \\
        .venv/bin/python -m pytest -q -p no:xdist tests/upgrade/test_rolling_upgrade.py

0.4.0 -> 0.5.0 fails in step 2 (issue 39): 0.4 rotates the retired record by count alone, a
0.5 resend of a minted id finds neither row nor record, and the job is admitted and run a
second time. Releases come from git (tests/upgrade/release.py, no network).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from release import TREE, Release, materialise
from test_proxy import Proxy

from conftest import tmp_server, wait_for
from procs import Spawner
from reliability import raw_violations

FROM = os.environ.get("ECHOMQ_TEST_UPGRADE_FROM", "v0.5.0")
TO = os.environ.get("ECHOMQ_TEST_UPGRADE_TO", TREE)
# 0.4 rotates its retired record at 25,000 ids (two generations). The record's current
# generation is filled to FILL_TO before a resend waits; CHURN more retirements, a batch of
# 1,000 each, then turn it over twice (first at 25,000, then 25,000 later).
FILL_TO = 24_000
CHURN = 28_000
KINDS = "ok,lane,delayed,dedup,kept,fail,flow,many"
CALLS = 48  # per producer, six rounds of the kinds
TICKS = 6  # apps.upgrade_app.TICKS
STEP_S = 120.0  # the generous deadline of every wait


class LossyProxy(Proxy):
    """test_proxy's proxy, with two changes: the reply of a native command (``EMQ.*``) may be
    dropped like a script's, and ``hold_on=b"..."`` drops the reply of the first request that
    holds those bytes and then resets every connection until :meth:`release` (the
    producer's resends wait, the test decides when they land)."""

    def __init__(self, upstream: int, *, hold_on: bytes | None = None, **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.hold_on = hold_on
        self.holding = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def _held(self) -> bool:
        return self.holding.is_set() and not self.released.is_set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._held():
            writer.transport.abort()
            return
        await super()._relay(reader, writer)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        other: asyncio.StreamWriter,
        script: list[bool],
        *,
        replies: bool,
    ) -> None:
        try:
            while data := await src.read(65536):
                if self._held():
                    self._cut(dst, other)
                    return
                if not replies:
                    head = data[:24]
                    script[0] = b"\r\nEVAL" in head or b"\r\nEMQ." in head
                    if self.hold_on is not None and not self.holding.is_set():
                        script[0] = self.hold_on in data
                elif script[0] and self._drops():
                    self.dropped += 1
                    self._cut(dst, other)  # the command ran; its reply never arrives
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return

    def _drops(self) -> bool:
        if self.hold_on is None:
            return bool(self.drop_reply) and self.rng.random() < self.drop_reply
        if self.holding.is_set():
            return False
        self.holding.set()
        return True


class Clock:
    """Seconds each step took (printed with the figures)."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.laps: list[str] = []

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps.append(f"{name} {now - self.t:.1f}")
        self.t = now

    def __str__(self) -> str:
        return ", ".join(self.laps)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Release, Release]:
    cache = tmp_path_factory.mktemp("releases")
    return materialise(FROM, cache), materialise(TO, cache)


class Fleet:
    """The processes of one run, each under its release; all SIGKILLed at the end."""

    def __init__(self, tmp_path: Path, url: str, queue: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.queue = queue
        self.spawner = Spawner(tmp_path, url)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.versions: list[str] = []  # each process's release
        self.clients: list[redis.Redis] = []
        self.executor: dict[str, str] = {}

    def env(self, release: Release, url: str | None = None) -> dict[str, str]:
        base = self.spawner.env(
            ECHOMQ_URL=url or self.url,
            ECHOMQ_EXECUTOR=self.executor.get(release.version, "auto"),
            EMQ_TEST_QUEUE=self.queue,
            EMQ_TEST_BOOKS_URL=self.url,
        )
        return release.env(base)

    def start(self, release: Release, *args: str, url: str | None = None, **extra: str) -> int:
        log = open(self.tmp_path / f"p{len(self.procs)}-{release.version}.log", "wb")  # noqa: SIM115
        # Unbuffered: a SIGKILLed process's last lines are in its log, not lost in a buffer.
        env = self.env(release, url) | extra | {"PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.procs.append(proc)
        self.versions.append(release.version)
        return len(self.procs) - 1

    def worker(self, release: Release) -> int:
        return self.start(
            release, "-m", "echomq", "worker", "apps.upgrade_app:app", "-c", "6", "--beat-ms", "200"
        )

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)

    def log(self, index: int, tail: int = 3000) -> str:
        logs = sorted(self.tmp_path.glob(f"p{index}-*.log"))
        return logs[0].read_text(errors="replace")[-tail:] if logs else ""

    def wait(self, index: int) -> None:
        code = self.procs[index].wait(STEP_S)
        assert code == 0, f"process {index} exited {code}:\n{self.log(index)}"

    def run(self, release: Release, *args: str, stdin: str = "") -> str:
        """Run a module of the release to its end; its stdout."""
        proc = subprocess.run(
            [sys.executable, *args],
            env=self.env(release),
            input=stdin.encode(),
            capture_output=True,
            timeout=STEP_S,
            check=False,
        )
        out, err = proc.stdout.decode(), proc.stderr.decode()
        assert proc.returncode == 0, f"{release.version} {args} exited {proc.returncode}:\n{err}"
        return out

    def client(self) -> redis.Redis:
        """A raw client of the server (closed with the fleet)."""
        self.clients.append(redis.Redis.from_url(self.url))
        return self.clients[-1]

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)
        for c in self.clients:
            c.close()


@pytest.fixture
def fleet(tmp_path: Path, qname: str) -> Iterator[list[Fleet]]:
    made: list[Fleet] = []
    yield made
    for f in made:
        f.stop()


class Books:
    """What the producers and handlers recorded (apps.upgrade_app, apps.upgrade_producer)."""

    def __init__(self, r: redis.Redis, queue: str) -> None:
        self.r = r
        self.queue = queue
        self.p = f"emqtest:{queue}:"

    def runs(self) -> list[tuple[str, int, int, int, str]]:
        out = []
        for raw in self.r.lrange(self.p + "runs", 0, -1):
            id_, token, floor, pid, task = raw.decode().split(":")
            out.append((id_, int(token), int(floor), int(pid), task))
        return out

    def acked(self) -> dict[str, str]:
        """Acknowledged id -> "kind by producer" (a dedup key's holder: the last call's)."""
        out = {}
        for raw in self.r.lrange(self.p + "acked", 0, -1):
            id_, kind, _, tag = raw.decode().split(":")
            out[id_] = f"{kind} by {tag}"
        return out

    def errors(self) -> list[str]:
        return [e.decode() for e in self.r.lrange(self.p + "errors", 0, -1)]


def busy(r: redis.Redis, books: Books, queues: tuple[str, ...]) -> list[str]:
    """What is still to run (empty once every acknowledged job ran, the repeat fired its
    limit, and nothing waits or runs but the churn's paused lane)."""
    runs = books.runs()
    out = []
    never = set(books.acked()) - {run[0] for run in runs}
    if never:
        out.append(f"{len(never)} acknowledged jobs have not run, e.g. {sorted(never)[:3]}")
    ticks = sum(1 for run in runs if run[4] == "tick" and run[1] == 1)
    if ticks < TICKS:
        out.append(f"the repeat fired {ticks} of {TICKS}")
    for q in queues:
        p = f"emq:{{{q}}}:"
        for name in ("pending", "active", "schedule"):
            if n := r.zcard(p + name):
                out.append(f"{q} {name}: {n}")
        if lanes := {m for m in r.smembers(p + "lanes") if m != b"filler"}:
            out.append(f"{q} lanes {sorted(lanes)}")  # (the churn's lane waits paused)
    return out


def settle_down(r: redis.Redis, books: Books, queues: tuple[str, ...]) -> None:
    """Wait until :func:`busy` is empty; fail saying what is left."""
    deadline = time.monotonic() + STEP_S
    while left := busy(r, books, queues):
        assert time.monotonic() < deadline, f"not done in {STEP_S} s: {left}"
        time.sleep(0.05)


@pytest.mark.parametrize("leg", ["lua", "native"])
def test_rolling_upgrade(
    leg: str,
    releases: tuple[Release, Release],
    session_url: str,
    tmp_path: Path,
    qname: str,
    fleet: list[Fleet],
) -> None:
    old, new = releases
    url = session_url
    if leg == "native":
        srv = tmp_server(
            tmp_path / "native-server", appendonly=False, args=["--loadmodule", str(old.module())]
        )
        url = srv.url
    try:
        run_the_contract(leg, old, new, url, tmp_path, qname, fleet)
    finally:
        for f in fleet:
            f.stop()
        if leg == "native":
            srv.stop()


def run_the_contract(
    leg: str, old: Release, new: Release, url: str, tmp_path: Path, qname: str, fleet: list[Fleet]
) -> None:
    kids = qname + "-kids"
    f = Fleet(tmp_path, url, qname)
    fleet.append(f)
    if leg == "native":
        f.executor[old.version] = "native"  # N-1's own module: refused unless it serves
    r = f.client()
    clock = Clock()
    books = Books(r, qname)
    port = urlsplit(url).port
    assert port is not None
    setup = (
        "from apps.upgrade_app import app, QUEUE, KIDS\n"
        "app.queue(QUEUE).limit_lane('lane0', 2)\n"
        "kids = app.queue(KIDS); kids.limit(4); kids.keep_completed(50)\n"
    )
    f.run(old, "-c", setup)

    # 1. The rolling upgrade, producers of both releases behind a proxy that drops replies.
    lossy = LossyProxy(port, drop_reply=0.05, seed=39).start()
    try:
        workers = [f.worker(old), f.worker(old), f.worker(new)]
        producers = [
            f.start(
                rel,
                "-m",
                "apps.upgrade_producer",
                url=lossy.url,
                EMQ_TEST_CALLS=str(CALLS),
                EMQ_TEST_KINDS=KINDS,
                EMQ_TEST_TAG=f"{rel.version}-{i}",
                EMQ_TEST_BASE=str(i * 10_000),
            )
            for i, rel in enumerate((old, old, new, new))
        ]
        wait_for(lambda: len(books.runs()) >= 40, STEP_S)
        clock.lap("40 runs")
        f.kill(workers[0])  # an N-1 worker, jobs in hand
        workers.append(f.worker(new))
        wait_for(lambda: len(books.runs()) >= 120, STEP_S)
        f.kill(workers[2])  # an N worker too
        workers.append(f.worker(new))
        for p in producers:
            f.wait(p)
        clock.lap("producers")
        settle_down(r, books, (qname, kids))
    finally:
        lossy.stop()
    dropped = lossy.dropped
    clock.lap("rolling")

    # 2. A resend held while an N-1 worker rotates the retired record.
    fill = max(0, FILL_TO - int(r.hlen(f"emq:{{{qname}}}:retired")))
    f.run(old, "-m", "apps.upgrade_churn", "prepare", str(CHURN), str(fill))
    clock.lap("staged")
    churn = f.start(old, "-m", "apps.upgrade_churn", "run")  # it waits for the go
    holding = LossyProxy(port, hold_on=b'"up.ok"').start()
    try:
        held = f.start(
            new,
            "-m",
            "apps.upgrade_producer",
            url=holding.url,
            EMQ_TEST_CALLS="6",
            EMQ_TEST_KINDS="ok",
            EMQ_TEST_TAG="held",
            EMQ_TEST_BASE="900000",
        )
        assert holding.holding.wait(STEP_S), f"no enqueue went through:\n{f.log(held)}"
        window = time.monotonic()  # the producer's retry_for runs from here
        settle_down(r, books, (qname, kids))  # the held call's job ran
        clock.lap("held")
        r.rpush(f"emqtest:{qname}:go", "go")
        f.wait(churn)
        churned = f.log(churn).strip().splitlines()[-1]
        clock.lap("churn")
        holding.release()
        window = time.monotonic() - window
        f.wait(held)
    finally:
        holding.stop()

    # 3. The last N-1 worker goes; N drains what it left.
    f.kill(workers[1])
    workers.append(f.worker(new))
    settle_down(r, books, (qname, kids))

    clock.lap("resend+drain")
    if leg == "native":  # N-1 ran its own module's commands (its workers say so at start)
        # A worker SIGKILLed early may not have started yet on a loaded box (its log is
        # empty): every N-1 worker that said how it serves said native, and one at least did.
        said = [f.log(w, 1 << 30) for w in workers if f.versions[w] == old.version]
        said = [text for text in said if "(executor " in text]
        assert said and all("(executor native)" in text for text in said), said
    errors = verdict(books, f, old, new, qname, kids, r)
    clock.lap("verdict")
    print(
        f"\n{old.version} -> {new.version} [{leg}]: {len(books.acked())} jobs acknowledged, "
        f"{len(books.runs())} runs, {dropped} replies dropped, churn {churned}, "
        f"resend held {window:.1f} s, "
        f"{len(books.errors())} calls not acknowledged {books.errors()[:2]}; seconds: {clock}"
    )
    assert not errors, "\n".join(errors)


def verdict(
    books: Books, f: Fleet, old: Release, new: Release, qname: str, kids: str, r: redis.Redis
) -> list[str]:
    """Every broken promise of the contract, in words (empty when it held)."""
    errors: list[str] = []
    acked = books.acked()
    runs = books.runs()
    ran = Counter(run[0] for run in runs)
    never = [i for i in acked if i not in ran]
    if never:
        errors.append(f"{len(never)} acknowledged jobs never ran, e.g. {never[:3]}")
    twice = [k for k, c in Counter((run[0], run[1]) for run in runs).items() if c > 1]
    if twice:
        by = {p.pid: v for p, v in zip(f.procs, f.versions, strict=True)}
        errors.append(
            f"{len(twice)} lease generations ran twice (an acknowledged call admitted "
            f"again), e.g. {[(i, t, acked.get(i)) for i, t in twice[:3]]}; their runs "
            f"(token, floor, worker's release): "
            f"{[(run[1], run[2], by.get(run[3])) for run in runs if run[0] == twice[0][0]]}"
        )
    carried = [(run[0], run[2], acked.get(run[0])) for run in runs if run[2] > 0]
    if carried:
        errors.append(f"{len(carried)} runs of a re-admitted id (floor > 0), e.g. {carried[:3]}")
    ticks = {run[0] for run in runs if run[4] == "tick"}
    if len(ticks) != TICKS:
        errors.append(f"the repeat fired {len(ticks)} occurrences, its limit is {TICKS}")
    held_errors = [e for e in books.errors() if e.startswith("held:")]
    if held_errors:
        errors.append(
            f"the held producer's calls were not acknowledged: {held_errors} (its resend "
            "waits while the churn runs, within retry_for=10 s: 'resend held' below says how "
            "long it waited)"
        )
    ask = {
        "dead": [i for i, k in acked.items() if k.startswith("fail ")],
        "kept": [i for i, k in acked.items() if k.startswith("kept ")],
    }
    for rel in (old, new):
        seen = json.loads(f.run(rel, "-m", "apps.upgrade_inspect", stdin=json.dumps(ask)))
        for queue, found in seen["check"].items():
            if found:
                errors.append(f"{rel.version}'s check() of {queue}: {found[:5]}")
        alive = {i: s for i, s in seen["states"].items() if s != "dead"}
        if alive:
            errors.append(
                f"{rel.version}: jobs sent to die are not dead: {list(alive.items())[:3]}"
            )
        wrong = {i: v for i, v in seen["results"].items() if v is None or int(v) % 2}
        if wrong:
            errors.append(
                f"{rel.version}: kept results missing or wrong: {list(wrong.items())[:3]}"
            )
    for queue in (qname, kids):
        found = raw_violations(r, queue)
        if found:
            errors.append(f"raw checker on {queue}: {found[:5]}")
    return errors
