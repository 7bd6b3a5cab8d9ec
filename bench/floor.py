"""Where a single enqueue's time goes: one producer, one call at a time, the same server.

    python bench/floor.py [--n 20000] [--rounds 5]

Rows, best round of each (the machine is noisy; the best round is the least disturbed):
- ``LPUSH`` through redis-py: one plain command, what huey's and rq's enqueue send;
- ``EVALSHA`` of a script that only returns 1: the floor of any one-script verb;
- echomq's enqueue script sent raw on one connection: the script's own server cost;
- ``Queue.enqueue`` and ``Task.enqueue``: echomq's whole path (validation, id, replay marker,
  serializer).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable

import redis

import echomq
from echomq import _protocol
from echomq.server import EmbeddedServer


def best_rate(fn: Callable[[], object], n: int, rounds: int) -> float:
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    srv = EmbeddedServer(tempfile.mkdtemp(prefix="echomq-floor-"), appendonly=False).start()
    try:
        r = redis.Redis.from_url(srv.url, single_connection_client=True)
        noop = r.script_load("return 1")
        keys = _protocol.Keys("floor")
        first = next(_protocol.enqueue(keys, b"payload"))
        assert first.script is not None
        r.script_load(first.script.source)

        def raw_enqueue() -> None:
            call = next(_protocol.enqueue(keys, b"payload"))
            r.execute_command("EVALSHA", first.script.sha, len(call.keys), *call.keys, *call.args)  # type: ignore[union-attr]

        q = echomq.Queue("floor", url=srv.url)
        app = echomq.App(srv.url)
        task = app.task(queue="floor-task", name="t")(lambda i: None)
        rows = [
            (
                "LPUSH via redis-py (one plain command)",
                lambda: r.execute_command("LPUSH", "x", "p"),
            ),
            ("EVALSHA of `return 1` via redis-py", lambda: r.execute_command("EVALSHA", noop, 0)),
            ("echomq enqueue script, raw EVALSHA", raw_enqueue),
            ("echomq Queue.enqueue(b'payload')", lambda: q.enqueue(b"payload")),
            ("echomq Task.enqueue(i)", lambda: task.enqueue(1)),
        ]
        print(f"command: `python bench/floor.py --n {a.n} --rounds {a.rounds}`\n")
        print("| path | calls/s (best round) | µs per call |")
        print("|---|---:|---:|")
        for label, fn in rows:
            rate = best_rate(fn, a.n, a.rounds)
            print(f"| {label} | {rate:,.0f} | {1e6 / rate:,.0f} |")
            sys.stdout.flush()
        q.close()
        app.close()
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
