"""What events (D15) and the per-minute metrics (D16) cost: processed/s with a queue's events on
vs off, and the server time of the worker's scripts with events off vs the scripts before the
events landed.

    python bench/events.py [--n 20000] [--rounds 3] [--concurrency 32] [--micro-n 20000]

1. Processed/s: one ``echomq worker`` process (the bench adapter's async no-op task, as in
   bench/run.py) on a private redis-server. Per run the queue is paused, N jobs are enqueued,
   and the clock runs from ``resume`` until the N-th completion. Events off and on alternate
   (off, on, off, on, ...), ``--rounds`` of each; the median of each and their ratio are
   printed (target: on >= 85 % of off): the ratio is the median of the rounds' own ratios, and
   the order alternates (off/on, on/off, ...), so a drift during the run cancels out.
2. Off-path cost: the worker's hot loop (claim_batch, then settle = complete B + claim B)
   driven raw on one connection, B = 100, and ``INFO commandstats`` ``usec_per_call`` of
   EVALSHA (nearly all of them settle calls). Three variants of the very same scripts:
   ``before`` = the scripts with include/observe.lua stubbed to what they did before D15/D16
   (no events read, ``HINCRBY metrics:<kind> count`` only), ``off`` = today's scripts, events
   off, ``on`` = today's scripts, events on. Interleaved rounds, median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

import echomq
from echomq.protocol import calls as _protocol
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer

BENCH = Path(__file__).resolve().parent
LUA = Path(echomq.__file__).resolve().parent / "lua"
QUEUE = "bench"  # the adapter's queue (bench/peers/echomq.py)

# What the scripts did before D15/D16: no event, the all-time counter only.
BEFORE_OBSERVE = """\
local function emit() end
local function emit_in() end
local function bump_metrics(base, kind, n)
  if n <= 0 then return end
  rcall('HINCRBY', base .. 'metrics:' .. kind, 'count', n)
end
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processed/s


def start_worker(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        BENCH_URL=url,
        ECHOMQ_URL=url,
        PYTHONPATH=os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p),
    )
    cmd = [
        sys.executable, "-m", "echomq", "worker", "peers.echomq:app",
        "-q", QUEUE, "-c", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=BENCH, env=env)


def processed_run(q: echomq.Queue, task: Any, n: int, events: bool) -> float:
    """N jobs enqueued behind a pause; seconds from resume to the N-th completion -> jobs/s."""
    if events:
        q.enable_events(10_000)
    else:
        q.disable_events()
    q.pause()
    base = q.counts()["completed"]
    for i in range(0, n, 5000):
        task.enqueue_many([((j,), {}) for j in range(i, min(n, i + 5000))])
    t0 = time.perf_counter()
    q.resume()
    while q.counts()["completed"] < base + n:
        time.sleep(0.005)
    return n / (time.perf_counter() - t0)


def processed(url: str, n: int, rounds: int, concurrency: int) -> dict[str, Any]:
    os.environ["BENCH_URL"] = url
    sys.path.insert(0, str(BENCH))
    from peers import echomq as adapter  # after BENCH_URL is set

    adapter.app.url = url
    q = echomq.Queue(QUEUE, url=url)
    worker = start_worker(url, concurrency)
    try:
        # Warm up: the worker is up and has served a few jobs.
        processed_run(q, adapter.noop, 2000, False)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(rounds):
            # Alternate the order too: a drift over the run (the queue's retired-id record
            # filling up to its cap, other load on the machine) favours neither side.
            for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
                rate = processed_run(q, adapter.noop, n, mode == "on")
                rates[mode].append(rate)
                log(f"  round {i + 1} events {mode}: {rate:,.0f} jobs/s")
        assert q.check() == [], q.check()
        xlen = int(redis.Redis.from_url(url).xlen(f"emq:{{{QUEUE}}}:events"))
    finally:
        worker.terminate()
        worker.wait(30)
        q.close()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    # The ratio of each round's adjacent pair, then the median: robust to a drift between
    # rounds that a ratio of the two medians would mix in.
    ratio = statistics.median(a / b for a, b in zip(rates["on"], rates["off"], strict=True))
    return {"off": off, "on": on, "ratio": ratio, "rates": rates, "stream_len": xlen}


# --------------------------------------------------------------------------- off path


def variant_source(name: str, before: bool) -> str:
    src = SCRIPTS[name].source
    if not before:
        return src
    observe = (LUA / "include" / "observe.lua").read_text(encoding="utf-8")
    assert src.count(observe) == 1, f"{name}: observe.lua not inlined once"
    return src.replace(observe, BEFORE_OBSERVE)


def hot_loop(r: redis.Redis, shas: dict[str, str], queue: str, n: int, batch: int) -> float:
    """claim_batch, then settle (complete the batch, claim the next) until N are done;
    returns EVALSHA usec_per_call over the loop."""
    k = _protocol.Keys(queue)
    q = echomq.Queue(queue, url=_url(r))
    try:
        for i in range(0, n, 5000):
            q.enqueue_many([b"x"] * min(5000, n - i))
    finally:
        q.close()
    r.config_resetstat()

    def run(call: Any, name: str) -> Any:
        return r.execute_command("EVALSHA", shas[name], len(call.keys), *call.keys, *call.args)

    reply = run(_protocol.claim_batch(k, batch), "claim_batch")
    jobs = [(j[0].decode(), int(j[2])) for j in reply]
    done = 0
    while jobs:
        done += len(jobs)
        reply = run(_protocol.settle(k, completed=jobs, n=batch), "settle")
        jobs = [(j[0].decode(), int(j[2])) for j in reply[2]]
    stats = r.info("commandstats")["cmdstat_evalsha"]
    assert done == n, (done, n)
    return float(stats["usec_per_call"])


def _url(r: redis.Redis) -> str:
    kw = r.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def off_path(url: str, n: int, rounds: int, batch: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url, single_connection_client=True)
    variants: dict[str, dict[str, str]] = {}
    for label, before in (("before", True), ("off", False), ("on", False)):
        variants[label] = {
            name: r.script_load(variant_source(name, before)) for name in ("claim_batch", "settle")
        }
    usec: dict[str, list[float]] = {label: [] for label in variants}
    for i in range(rounds):
        for label, shas in variants.items():
            queue = f"evbench-{label}-{i}"
            if label == "on":
                r.hset(f"emq:{{{queue}}}:meta", "events", 10_000)
            usec[label].append(hot_loop(r, shas, queue, n, batch))
            log(f"  round {i + 1} {label}: {usec[label][-1]:.1f} usec per EVALSHA")
    med = {label: statistics.median(v) for label, v in usec.items()}
    return {"usec": med, "all": usec, "batch": batch}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--micro-n", type=int, default=20_000)
    a = parser.parse_args()
    srv = EmbeddedServer(tempfile.mkdtemp(prefix="echomq-events-"), appendonly=False).start()
    try:
        info = redis.Redis.from_url(srv.url).info("server")
        log(f"redis-server {info['redis_version']} on {srv.url}")
        log("processed/s, events off vs on:")
        p = processed(srv.url, a.n, a.rounds, a.concurrency)
        log("off path, EVALSHA usec per call of the worker's hot loop:")
        o = off_path(srv.url, a.micro_n, a.rounds, 100)
    finally:
        srv.stop()
    print(f"echomq {echomq.__version__}, redis-server {info['redis_version']}")
    print(
        f"processed/s (N={a.n}, -c {a.concurrency}, median of {a.rounds} interleaved rounds): "
        f"events off {p['off']:,.0f}, on {p['on']:,.0f}, on/off (median of per-round ratios) "
        f"{p['ratio']:.1%} "
        f"(target >= 85%); stream length after: {p['stream_len']}"
    )
    u = o["usec"]
    print(
        f"hot loop usec per EVALSHA (settle of {o['batch']} + claim {o['batch']}, "
        f"N={a.micro_n}, median of {a.rounds}): before D15/D16 {u['before']:.1f}, "
        f"events off {u['off']:.1f} ({u['off'] / u['before'] - 1:+.1%}), "
        f"events on {u['on']:.1f} ({u['on'] / u['before'] - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
