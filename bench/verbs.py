"""Micro-benchmark of the protocol verbs: ops/s for enqueue, claim, complete, claim_batch
(batch 100) and a full lifecycle (enqueue -> claim -> complete), each three ways:

- sync:      ``Queue``, one verb per round trip;
- async:     ``AsyncQueue``, 16 tasks in flight;
- pipelined: ``Queue``'s executor pipeline, 100 calls per round trip (10 batch claims).

Every figure is the median of 3 rounds; each round runs on a fresh queue, which it
obliterates at the end. claim_batch counts jobs claimed per second (100 per call);
lifecycle counts jobs taken through all three verbs per second.

    python bench/verbs.py [--url URL] [--n N]

Without ``--url`` it starts its own server (``EmbeddedServer``, AOF off) in a temp dir and
stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import redis

import echomq
from echomq.protocol import calls as _protocol
from echomq.server import EmbeddedServer

VERBS = ("enqueue", "claim", "complete", "claim_batch", "lifecycle")
MODES = ("sync", "async", "pipelined")
ROUNDS = 3
TASKS = 16
PIPE = 100  # calls per pipelined round trip
BATCH = 100  # claim_batch size
LEASE = 600_000  # nothing lapses during a run
PAYLOAD = b'{"to": "someone@example.com", "n": 12345}'

Results = dict[str, float]


def fresh(url: str) -> echomq.Queue:
    return echomq.Queue(f"bench-{uuid.uuid4().hex[:10]}", url=url)


def drop(q: echomq.Queue) -> None:
    q.pause()
    q.obliterate(force=True)
    q.close()


def rate(n: int, fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t)


def chunks(n: int, size: int) -> Iterator[int]:
    for start in range(0, n, size):
        yield min(size, n - start)


def fill(q: echomq.Queue, n: int) -> None:
    for size in chunks(n, 1000):
        q.enqueue_many([PAYLOAD] * size)


# ------------------------------------------------------------------ sync


def sync_round(url: str, n: int) -> Results:
    q = fresh(url)
    out: Results = {}
    jobs: list[echomq.Job] = []

    def enqueue() -> None:
        for _ in range(n):
            q.enqueue(PAYLOAD)

    def claim() -> None:
        for _ in range(n):
            job = q.claim(lease_ms=LEASE)
            assert job is not None
            jobs.append(job)

    def complete() -> None:
        for job in jobs:
            q.complete(job.id, job.token)

    def claim_batch() -> None:
        got = 0
        while got < n:
            batch = q.claim_batch(BATCH, lease_ms=LEASE)
            assert batch, "the queue ran dry"
            got += len(batch)

    def lifecycle() -> None:
        for _ in range(n):
            q.enqueue(PAYLOAD)
            job = q.claim(lease_ms=LEASE)
            assert job is not None
            q.complete(job.id, job.token)

    out["enqueue"] = rate(n, enqueue)
    out["claim"] = rate(n, claim)
    out["complete"] = rate(n, complete)
    fill(q, n)
    out["claim_batch"] = rate(n, claim_batch)
    drop(q)
    q = fresh(url)
    out["lifecycle"] = rate(n, lifecycle)
    assert q.counts()["completed"] == n
    drop(q)
    return out


# ------------------------------------------------------------------ async


async def spread(n: int, work: Callable[[int], Awaitable[None]]) -> float:
    """Run ``n`` operations as TASKS concurrent tasks; ops/s."""
    shares = [n // TASKS + (1 if i < n % TASKS else 0) for i in range(TASKS)]
    t = time.perf_counter()
    await asyncio.gather(*(work(s) for s in shares))
    return n / (time.perf_counter() - t)


async def async_round(url: str, n: int) -> Results:
    aq = echomq.AsyncQueue(f"bench-{uuid.uuid4().hex[:10]}", url=url)
    out: Results = {}
    jobs: list[echomq.Job] = []

    async def enqueue(k: int) -> None:
        for _ in range(k):
            await aq.enqueue(PAYLOAD)

    async def claim(k: int) -> None:
        for _ in range(k):
            job = await aq.claim(lease_ms=LEASE)
            assert job is not None
            jobs.append(job)

    async def complete(k: int) -> None:
        for _ in range(k):
            job = jobs.pop()
            await aq.complete(job.id, job.token)

    async def claim_batch(k: int) -> None:
        got = 0
        while got < k:
            batch = await aq.claim_batch(min(BATCH, k - got), lease_ms=LEASE)
            assert batch, "the queue ran dry"
            got += len(batch)

    async def lifecycle(k: int) -> None:
        for _ in range(k):
            await aq.enqueue(PAYLOAD)
            job = await aq.claim(lease_ms=LEASE)
            assert job is not None  # possibly another task's job: every claim settles one
            await aq.complete(job.id, job.token)

    out["enqueue"] = await spread(n, enqueue)
    out["claim"] = await spread(n, claim)
    out["complete"] = await spread(n, complete)
    # claim_batch: each task claims its share in batches of (up to) 100.
    for size in chunks(n, 1000):
        await aq.enqueue_many([PAYLOAD] * size)
    out["claim_batch"] = await spread(n, claim_batch)
    await aq.pause()
    await aq.obliterate(force=True)
    await aq.resume()
    out["lifecycle"] = await spread(n, lifecycle)
    assert (await aq.counts())["completed"] == n
    await aq.pause()
    await aq.obliterate(force=True)
    await aq.aclose()
    return out


# ------------------------------------------------------------------ pipelined


def pipelined_round(url: str, n: int) -> Results:
    q = fresh(url)
    k, x = q._k, q._x
    out: Results = {}
    jobs: list[echomq.Job] = []

    def run(calls: list[_protocol.Call[Any]]) -> list[Any]:
        replies = x.pipeline(calls)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    def enqueue_calls(size: int) -> list[_protocol.Call[Any]]:
        # enqueue is a plan (it may re-mint on a collision); its first step is the Call.
        return [next(_protocol.enqueue(k, PAYLOAD)) for _ in range(size)]

    def enqueue() -> None:
        for size in chunks(n, PIPE):
            assert run(enqueue_calls(size)) == ["enqueued"] * size

    def claim() -> None:
        for size in chunks(n, PIPE):
            jobs.extend(run([_protocol.claim(k, LEASE)] * size))

    def complete() -> None:
        for start in range(0, n, PIPE):
            run([_protocol.complete(k, j.id, j.token) for j in jobs[start : start + PIPE]])

    def claim_batch() -> None:
        got = 0
        while got < n:
            calls = [_protocol.claim_batch(k, BATCH, LEASE)] * (PIPE // 10)
            claimed = sum(len(batch) for batch in run(calls))
            assert claimed, "the queue ran dry"
            got += claimed

    def lifecycle() -> None:
        for size in chunks(n, PIPE):
            run(enqueue_calls(size))
            claimed = run([_protocol.claim(k, LEASE)] * size)
            run([_protocol.complete(k, j.id, j.token) for j in claimed])

    out["enqueue"] = rate(n, enqueue)
    out["claim"] = rate(n, claim)
    assert len(jobs) == n and all(j is not None for j in jobs)
    out["complete"] = rate(n, complete)
    fill(q, n)
    out["claim_batch"] = rate(n, claim_batch)
    drop(q)
    q = fresh(url)
    k, x = q._k, q._x
    out["lifecycle"] = rate(n, lifecycle)
    assert q.counts()["completed"] == n
    drop(q)
    return out


# ------------------------------------------------------------------ main


def bench(url: str, n: int) -> dict[str, dict[str, float]]:
    # Warm up: load every script and open the connections once.
    sync_round(url, 200)
    asyncio.run(async_round(url, 200))
    pipelined_round(url, 200)
    samples: dict[str, dict[str, list[float]]] = {m: {v: [] for v in VERBS} for m in MODES}
    for _ in range(ROUNDS):  # rounds interleave the modes, so drift hits all three alike
        for mode, result in (
            ("sync", sync_round(url, n)),
            ("async", asyncio.run(async_round(url, n))),
            ("pipelined", pipelined_round(url, n)),
        ):
            for verb in VERBS:
                samples[mode][verb].append(result[verb])
    return {m: {v: statistics.median(s) for v, s in by.items()} for m, by in samples.items()}


def table(medians: dict[str, dict[str, float]]) -> str:
    head = "| verb | " + " | ".join(f"{m} ops/s" for m in MODES) + " |"
    rule = "|---|" + "---:|" * len(MODES)
    rows = [f"| {v} | " + " | ".join(f"{medians[m][v]:,.0f}" for m in MODES) + " |" for v in VERBS]
    return "\n".join([head, rule, *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start a private one)")
    ap.add_argument("--n", type=int, default=5000, help="operations per verb per round")
    args = ap.parse_args()
    if args.n < BATCH:
        ap.error(f"--n must be at least {BATCH}")
    server = None
    url = args.url
    with tempfile.TemporaryDirectory() as tmp:
        if url is None:
            server = EmbeddedServer(tmp, appendonly=False).start()
            url = server.url
        try:
            info = redis.Redis.from_url(url).info("server")
            t = time.perf_counter()
            medians = bench(url, args.n)
            elapsed = time.perf_counter() - t
        finally:
            if server is not None:
                server.stop()
    print(
        f"echomq {echomq.__version__}, redis-server {info.get('redis_version')}, "
        f"Python {platform.python_version()}, {os.cpu_count()} cpus; "
        f"N={args.n}, median of {ROUNDS} rounds, async {TASKS} tasks, pipeline {PIPE} calls; "
        f"{elapsed:.1f}s"
    )
    print(table(medians))


if __name__ == "__main__":
    main()
