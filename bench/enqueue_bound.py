"""Where the single enqueue's ratio to huey's comes from (issue 28): echomq's sync
``task.enqueue(i)`` against huey's ``noop(i)``, interleaved in one process on one private
server (Lua executor, no module), with echomq's enqueue script swapped in turn for

- ``real``: the script echomq ships;
- ``lean``: the three writes a job needs and nothing else (row, waiting set, wake token): no
  check, no event, no ring resync -- not a correct enqueue, a floor for any script;
- ``ret``: a script that writes nothing and answers ``enqueued``: no server work at all.

If even ``ret`` stays below a ratio, no cheaper script reaches it: what is left is the round
trip both producers pay and each client's own path.

    bench/.venv/bin/python bench/enqueue_bound.py [--rounds 12] [--n 4000]

Needs huey (``bash bench/setup.sh``). Each round times huey, then the three variants, N calls
each; the figure is huey's µs per call over the variant's, per round, and the median.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from huey import RedisHuey

import echomq
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer

LEAN = """local base, id = ARGV[1], ARGV[2]
redis.call('HSET', KEYS[1], 'state', 'pending', 'attempts', '0', 'payload', ARGV[3])
redis.call('ZADD', base .. 'pending', 0, id)
if redis.call('LLEN', base .. 'wake') < 64 then redis.call('LPUSH', base .. 'wake', '1') end
return 'enqueued'"""
RET = "return 'enqueued'"


def _use(source: str) -> None:
    """Point the enqueue Script at ``source`` (its cached source and sha: EVALSHA, then EVAL
    on NOSCRIPT, loads it on the server like the real one)."""
    script = SCRIPTS["enqueue"]
    script.__dict__["source"] = source
    script.__dict__["sha"] = hashlib.sha1(source.encode()).hexdigest()


def _us_per_call(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--n", type=int, default=4000)
    a = ap.parse_args()
    real = SCRIPTS["enqueue"].source
    with tempfile.TemporaryDirectory() as tmp:
        srv = EmbeddedServer(Path(tmp) / "server", appendonly=False).start()
        try:
            base = srv.url.rsplit("/", 1)[0]  # the URL names db 0: each producer its own db
            app = echomq.App(base + "/0?executor=lua")

            @app.task(queue="bench", name="noop")
            async def noop(i: int) -> None:
                return None

            app.queue("bench").counts()
            huey = RedisHuey("bench", url=base + "/1")

            @huey.task(name="noop")
            def hnoop(i: int) -> bool:
                return True

            huey.storage.conn.ping()
            ratios: dict[str, list[float]] = {"real": [], "lean": [], "ret": []}
            for _ in range(a.rounds):
                theirs = _us_per_call(hnoop, a.n)
                for name, source in (("real", real), ("lean", LEAN), ("ret", RET)):
                    _use(source)
                    ratios[name].append(theirs / _us_per_call(noop.enqueue, a.n))
                _use(real)
            app.close()
        finally:
            srv.stop()
    print(f"{a.rounds} rounds of {a.n} calls each; huey µs per call / echomq µs per call")
    for name, got in ratios.items():
        per = " ".join(f"{x:.2f}" for x in got)
        print(f"{name:5s} per round: {per}  median {statistics.median(got):.2f}")


if __name__ == "__main__":
    main()
