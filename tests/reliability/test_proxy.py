"""Dropped connections: a fault-injecting TCP proxy (asyncio, loopback, written here) sits
between echomq's clients and the server and cuts connections at random.

- The whole run: producer and worker processes talk to the server only through a proxy that
  gives every connection a random life of 50-500 ms (and drops a reply now and then). The
  run completes with the chaos test's invariants, and no enqueue call made two jobs.
- The no-blind-replay rule, pinned down with a proxy that applies a command and then loses
  its reply: ``add_log`` raises instead of writing twice (a client that replays blindly
  writes twice: the control), ``enqueue`` replays its own id and makes exactly one job per
  call, and a completion whose reply was lost is fenced on the caller's retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import echomq
from conftest import wait_for
from echomq.protocol import calls as _p
from echomq.protocol.scripts import SCRIPTS
from procs import TESTS_DIR, Spawner, wait_log
from reliability import leftover_keys, payload, read_books, verify

pytestmark = [pytest.mark.chaos]


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` (a port), on its own event loop in
    a thread. Faults: each connection lives a random ``life_ms`` (then both sides are reset),
    and the reply to a script call (EVALSHA/EVAL: every echomq verb) is, with probability
    ``drop_reply``, swallowed and the connection reset instead — the command ran, its reply
    is lost. (Replies of the connection handshake are spared: a dozen round trips each with
    the same odds would make reconnecting the only thing clients do.)"""

    def __init__(
        self,
        upstream: int,
        *,
        life_ms: tuple[int, int] | None = None,
        drop_reply: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.upstream = upstream
        self.life_ms = life_ms
        self.drop_reply = drop_reply
        self.rng = random.Random(seed)
        self.port = 0
        self.connections = self.cuts = self.dropped = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._live: set[asyncio.Transport] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Proxy:
        self._thread.start()
        assert self._ready.wait(60), "the proxy did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the proxy did not stop"

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await self._relay(reader, writer)
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        # Reset every live connection and let its relay see it end (cancelling the handler
        # tasks instead makes asyncio log their CancelledError).
        while handlers or self._live:
            for t in list(self._live):
                t.abort()
            await asyncio.sleep(0.01)
        await server.wait_closed()

    def _cut(self, *writers: asyncio.StreamWriter) -> None:
        for w in writers:
            w.transport.abort()  # a reset, not a polite close

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._live.add(writer.transport)  # type: ignore[arg-type]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            self._live.discard(writer.transport)  # type: ignore[arg-type]
            return
        self._live.add(up_writer.transport)  # type: ignore[arg-type]
        timer = None
        if self.life_ms is not None:

            def expire() -> None:
                self.cuts += 1
                self._cut(writer, up_writer)

            life = self.rng.uniform(*self.life_ms) / 1000
            timer = asyncio.get_running_loop().call_later(life, expire)
        script = [False]  # whether the last request was a script call
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, writer, script, replies=False)),
            asyncio.ensure_future(self._pump(up_reader, writer, up_writer, script, replies=True)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if timer is not None:
                timer.cancel()
            self._cut(writer, up_writer)
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._live.discard(writer.transport)  # type: ignore[arg-type]
            self._live.discard(up_writer.transport)  # type: ignore[arg-type]

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
                if not replies:
                    script[0] = b"\r\nEVAL" in data[:24]
                elif script[0] and self.drop_reply and self.rng.random() < self.drop_reply:
                    self.dropped += 1
                    self._cut(dst, other)  # the command ran; its reply never arrives
                    return
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return


@pytest.fixture
def server_port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@pytest.fixture
def proxies() -> Iterator[list[Proxy]]:
    started: list[Proxy] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Producer processes this test started; killed (by pid) if still running at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(60)


# --------------------------------------------------------------------------- the whole run

JOBS_PER_PRODUCER = 2500
PRODUCERS = 2
WORKERS = 3


def test_run_through_a_cutting_proxy(
    spawn: Spawner,
    proxies: list[Proxy],
    children: list[subprocess.Popen[bytes]],
    server_port: int,
    url: str,
    r: redis.Redis,
    qname: str,
    tmp_path: Path,
) -> None:
    proxy = Proxy(server_port, life_ms=(50, 500), drop_reply=0.002).start()
    proxies.append(proxy)
    t0 = time.monotonic()
    env = spawn.env(
        ECHOMQ_URL=proxy.url,  # every echomq call goes through the proxy
        EMQ_TEST_HISTORY_URL=url,  # the bookkeeping does not (it must not be cut)
        EMQ_TEST_QUEUE=qname,
        EMQ_TEST_LEASE_MS="2000",
        EMQ_TEST_FAIL_EVERY="50",
        EMQ_TEST_RUN_MS="2",
        EMQ_TEST_PRODUCE_PAUSE_MS="4",  # ~10 s of production: many connection lives
    )
    args = ["-c", "16", "--beat-ms", "200", "--max-stalled", "1000000"]
    workers = [spawn.start("worker", "apps.chaos:app", *args, env=env) for _ in range(WORKERS)]
    outs = [tmp_path / f"producer-{i}.jsonl" for i in range(PRODUCERS)]
    for i, out in enumerate(outs):
        cmd = [sys.executable, "-m", "apps.producer", qname]
        cmd += [str(i * JOBS_PER_PRODUCER), str(JOBS_PER_PRODUCER), str(out)]
        log = open(tmp_path / f"producer-{i}.log", "wb")  # noqa: SIM115 - closed below
        children.append(subprocess.Popen(cmd, cwd=TESTS_DIR, env=env, stdout=log, stderr=log))
        log.close()
    for p in children:
        assert p.wait(170) == 0, (tmp_path / "producer-0.log").read_text()

    calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    failed = [c for c in calls if "error" in c]
    assert failed == [], failed[:3]  # retry_for rode out every cut
    enqueued: dict[str, int] = {}
    for c in calls:
        assert c["statuses"] == ["enqueued"] * len(c["ns"]), c  # never someone's duplicate
        enqueued.update(zip(c["ids"], c["ns"], strict=True))
    total = PRODUCERS * JOBS_PER_PRODUCER
    assert sorted(enqueued.values()) == list(range(total))  # one id per job asked for

    def drained() -> bool:
        c = echomq.Queue(qname, url=url).counts()
        return c["pending"] + c["active"] + c["schedule"] == 0 and c["completed"] >= total

    wait_for(drained, timeout=120)
    took = time.monotonic() - t0
    for w in workers:
        assert w.popen.poll() is None, w.text()[-3000:]
        wait_log(w, "serving")
        w.signal(15)
    for w in workers:
        assert w.wait(60) == 0, w.text()[-3000:]

    q = echomq.Queue(qname, url=url)
    counts = q.counts()
    assert counts == {**counts, "pending": 0, "active": 0, "schedule": 0, "dead": 0}
    assert counts["completed"] == total  # no enqueue call made two jobs, none was lost
    assert q.check() == []
    assert leftover_keys(r, qname) == []
    q.close()
    books = read_books(r, qname)
    v = verify(books, enqueued, killed=set())
    assert v.errors == [], "\n".join(v.errors[:20])
    assert proxy.cuts > 50, proxy.cuts
    print(
        f"\nproxy: {total} jobs from {PRODUCERS} producer processes ({len(calls)} calls) to "
        f"{WORKERS} workers in {took:.1f}s through {proxy.connections} connections, "
        f"{proxy.cuts} cut at the end of their life, {proxy.dropped} replies dropped; "
        f"runs {v.runs}: {v.retries_accepted} planted-failure retries and "
        f"{v.runs - v.jobs - v.retries_accepted} redeliveries; settles accepted "
        f"{v.settles_accepted}, refused {v.settles_refused} (gone on a resend: "
        f"{sum(1 for x in books.refused if x[4] == 'gone')})"
    )


# --------------------------------------------------------------------------- no blind replays


def lossy_queue(proxy: Proxy, qname: str, **kw: Any) -> echomq.Queue:
    return echomq.Queue(qname, url=proxy.url, **kw)


def test_add_log_with_a_lost_reply_raises_instead_of_writing_twice(
    proxies: list[Proxy], server_port: int, url: str, qname: str
) -> None:
    proxy = Proxy(server_port, drop_reply=0.3, seed=1).start()
    proxies.append(proxy)
    direct = echomq.Queue(qname, url=url)
    job = direct.enqueue(b"x").id

    def hammer(q: echomq.Queue, tag: str, calls: int = 150) -> tuple[set[str], set[str]]:
        ok, raised = set(), set()
        for i in range(calls):
            line = f"{tag}-{i}"
            try:
                q.add_log(job, line)
                ok.add(line)
            except redis.ConnectionError:
                raised.add(line)
        return ok, raised

    lossy = lossy_queue(proxy, qname)
    ok, raised = hammer(lossy, "echomq")
    lossy.close()
    lines = Counter(x.decode() for x in direct.logs(job) if x.startswith(b"echomq-"))
    assert max(lines.values()) == 1, [k for k, n in lines.items() if n > 1]  # never twice
    assert all(lines[x] == 1 for x in ok)
    applied_unacked = [x for x in raised if lines[x] == 1]
    # The proxy really lost replies of applied commands: a blind replay would have doubled
    # exactly these.
    assert len(applied_unacked) > 5, (len(raised), proxy.dropped)

    # The control: the same script sent by a redis-py client with automatic retries on
    # connection errors (what echomq turns off on its clients) writes lines twice. This is
    # what the test above would catch.
    blind = redis.Redis.from_url(proxy.url, retry=Retry(ExponentialBackoff(cap=0.05), 3))
    add_log = SCRIPTS["add_log"]
    jk = f"emq:{{{qname}}}:job:{job}"
    for i in range(150):
        with contextlib.suppress(redis.ConnectionError):
            blind.eval(add_log.source, 2, jk, jk + ":logs", f"blind-{i}", 0)
    blind.close()
    doubled = Counter(x.decode() for x in direct.logs(job) if x.startswith(b"blind-"))
    assert max(doubled.values()) >= 2
    print(
        f"\nadd_log under lost replies: {len(ok)} returned, {len(raised)} raised "
        f"({len(applied_unacked)} of them had applied); written twice: 0 "
        f"(a blindly retrying client: {sum(1 for n in doubled.values() if n > 1)})"
    )
    direct.close()


def test_enqueue_with_lost_replies_makes_one_job_per_call(
    proxies: list[Proxy], server_port: int, url: str, r: redis.Redis, qname: str
) -> None:
    proxy = Proxy(server_port, drop_reply=0.3, seed=2).start()
    proxies.append(proxy)
    lossy = lossy_queue(proxy, qname, retry_for=60)
    receipts = [lossy.enqueue(payload(n)) for n in range(200)]  # minted ids
    receipts += [lossy.enqueue(payload(n), id=echomq.ids.mint()) for n in range(200, 300)]
    many = lossy.enqueue_many([payload(n) for n in range(300, 400)])
    assert all(isinstance(e, echomq.Enqueued) for e in many)
    receipts += [e for e in many if isinstance(e, echomq.Enqueued)]
    lossy.close()
    assert all(e.status == "enqueued" for e in receipts)  # a replay knows its own id
    assert len({e.id for e in receipts}) == 400
    direct = echomq.Queue(qname, url=url)
    assert direct.counts()["pending"] == 400  # exactly one job per call
    pending = {x.decode() for x in r.zrange(f"emq:{{{qname}}}:pending", 0, -1)}
    assert pending == {e.id for e in receipts}
    assert proxy.dropped > 20, proxy.dropped  # replies really were lost

    # Completions under lost replies: never resent; the caller's own retry is fenced.
    proxy.drop_reply = 0.0
    lossy = lossy_queue(proxy, qname)
    jobs = lossy.claim_batch(400, lease_ms=120_000)
    assert len(jobs) == 400
    proxy.drop_reply = 0.3
    outcomes: Counter[str] = Counter()
    for job in jobs:
        while True:
            try:
                lossy.complete(job.id, job.token)
                outcomes["completed"] += 1
                break
            except redis.ConnectionError:
                outcomes["reply lost"] += 1  # not resent by echomq: the caller decides
            except echomq.JobGone:
                outcomes["gone on the retry: it had landed"] += 1
                break
    lossy.close()
    assert outcomes["completed"] + outcomes["gone on the retry: it had landed"] == 400
    assert outcomes["gone on the retry: it had landed"] > 0
    assert direct.counts()["completed"] == 400  # each exactly once
    assert direct.check() == []
    direct.close()
    print(f"\nenqueue/complete under lost replies: {proxy.dropped} replies dropped; {outcomes}")


@pytest.mark.parametrize("many", [False, True])
def test_a_replayed_enqueue_never_admits_a_finished_job_again(
    url: str, r: redis.Redis, qname: str, many: bool
) -> None:
    """The race the cutting proxy found: an enqueue lands, its reply is lost, a worker
    completes the job (its row is deleted), then the producer's resend arrives. Keyed on the
    row alone, the resend admitted the job a second time (it ran twice, completed counted
    two). The call's replay marker makes the resend answer 'replayed' instead."""
    q = echomq.Queue(qname, url=url)
    keys = _p.Keys(qname)
    plan = (
        _p.enqueue_many(keys, [payload(1)], replay_ms=60_000)
        if many
        else _p.enqueue(keys, payload(1), replay_ms=60_000)
    )
    step = next(plan)
    first = q._x.pipeline(step) if many else q._x.call(step)  # it lands ...
    assert first in ([["enqueued"]], "enqueued")
    job = q.claim(lease_ms=60_000)  # ... a worker runs and completes it ...
    assert job is not None
    q.complete(job.id, job.token)
    step = plan.throw(_p.Replay(redis.ConnectionError("reply lost")))  # ... the resend:
    again = q._x.pipeline(step) if many else q._x.call(step)
    assert again in ([["replayed"]], "replayed")
    with pytest.raises(StopIteration) as done:
        plan.send(again)
    receipt = done.value.value[0] if many else done.value.value
    assert receipt == echomq.Enqueued(job.id, "enqueued")
    counts = q.counts()
    assert (counts["pending"], counts["completed"]) == (0, 1)  # not admitted twice
    # A new enqueue of the retired id (a new call, a new nonce) is a new job, as before.
    assert q.enqueue(payload(2), id=job.id).status == "enqueued"
    q.close()
