"""A queue-wide limit against the same concurrency without one (issue 37, item 6; issue 41).

One in-process worker runs N no-op jobs twice: under ``limit(3)`` with ``concurrency=4``
(one slot more than the limit, so its claims come back short), and with no limit at
``concurrency=3`` (the same three in flight). Reports jobs/s for each, the worker's default
beat (1 s), with the backlog's wake tokens deleted before the worker starts (a producer that
has stopped; each token would wake one refill). Before issue 37 the limited run refilled a
freed slot only at the next beat or a producer's wake token; with it, the settle that frees
room woke the parked worker (about one job in four went through a park: BLPOP, a claim and
a ``rate_ttl`` read, 0.72x of the unlimited run). Since issue 41 the settle answers that the
limit holds (``Settled.at_limit``) and the worker's next settles claim the room they free:
no park, one round trip per turn.

    python bench/limit_refill.py [--jobs 200] [--cap-s 120] [--src DIR] [--executors lua,native]
        [--rounds 1]

``--src`` runs another checkout's ``src`` (e.g. the code before the fix, Lua executor). It
starts its own server (``EmbeddedServer``, AOF off) in a temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def run(url: str, name: str, jobs: int, limit: int | None, concurrency: int, cap_s: float) -> Any:
    import echomq

    app = echomq.App(url=url)
    done: list[int] = []

    @app.task(queue=name, name="noop")
    def noop(i: int) -> None:
        done.append(i)

    q = app.queue(name)
    if limit is not None:
        q.limit(limit)
    for i in range(jobs):
        noop.enqueue(i)
    # The backlog's wake tokens are gone (taken by idle workers long ago, or the producer
    # stopped): the worker's refills come from its own loop, as in a steady state.
    import redis

    r = redis.Redis.from_url(url.partition("?")[0])  # without echomq's own ?executor=
    r.delete("emq:{" + name + "}:wake")
    r.close()
    worker = echomq.Worker(app, queues=[name], concurrency=concurrency)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    t = time.perf_counter()
    thread.start()
    while len(done) < jobs and time.perf_counter() - t < cap_s:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t
    loop.call_soon_threadsafe(worker.stop)
    thread.join(60)
    loop.close()
    app.close()
    return len(done), elapsed


RUNS = (("limit(3), -c 4", 3, 4), ("no limit, -c 3", None, 3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--cap-s", type=float, default=120.0)
    ap.add_argument("--src", help="import echomq from this directory instead")
    ap.add_argument("--executors", default="lua", help="lua,native (native: loads trafikey.so)")
    ap.add_argument("--rounds", type=int, default=1)
    opts = ap.parse_args()
    if opts.src:
        sys.path.insert(0, opts.src)
    import echomq
    from echomq.server import EmbeddedServer

    print(f"echomq from {echomq.__file__}")
    executors = [x for x in opts.executors.split(",") if x]
    args: list[str] = []
    if "native" in executors:
        so = Path(__file__).resolve().parent.parent / "native" / "trafikey.so"
        args = ["--loadmodule", str(so)]
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(tmp, appendonly=False, args=args).start()
        try:
            for rnd in range(opts.rounds):
                for ex in executors:
                    rates = []
                    for label, limit, conc in RUNS:
                        url = f"{srv.url}?executor={ex}"
                        n, s = run(url, f"refill{conc}r{rnd}", opts.jobs, limit, conc, opts.cap_s)
                        rates.append(n / s)
                        print(f"{ex:6} {label:16} {n:5} jobs in {s:7.2f} s  {n / s:8.1f} jobs/s")
                    print(f"{ex:6} round {rnd + 1} ratio {rates[0] / rates[1]:.2f}")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
