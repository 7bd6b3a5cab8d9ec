"""The worker-side Python of one no-op job, without a server (issue 41): what
``bench/worker_cpu.py`` measures end to end, less the socket, redis-py and the server.

    python bench/worker_micro.py [--n 20000] [--batch 100] [--repeat 5]
    PYTHONPATH=/tmp/other/src python bench/worker_micro.py   # another tree, to compare

Per batch of ``--batch`` jobs, as one turn of the worker at ``-c 2*batch``: decode a claim
reply (``protocol.calls.settle``'s decoder, on a reply built here), start each job
(``Worker._start``: the run's records, the envelope, the handler's Task), let the loop run
the async no-op handlers to their settle, build the next ``settle`` call, and count its
verdicts. CPU time of this thread (``time.thread_time``), per job, the best of ``--repeat``
(the collector frozen and its threshold raised, as ``Worker.run`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import time

import echomq
from echomq.protocol import calls as _p
from echomq.protocol import kernel as _k
from echomq.runtime.queueloop import QueueLoop
from echomq.worker import Worker

STEPS = ("decode", "start", "run", "build", "verdicts")


async def one_pass(n: int, batch: int) -> dict[str, float]:
    app = echomq.App("redis://127.0.0.1:1")  # never connected

    @app.task(queue="micro", name="noop")
    async def noop() -> None:
        return None

    w = Worker(app, ["micro"], concurrency=2 * batch)
    keys = _k.Keys("micro")
    ql = QueueLoop(keys, 30_000)
    ql.finish = functools.partial(w._finish, ql)
    w._loops.append(ql)
    ql.turns.add(asyncio.get_running_loop().create_future())  # a turn "in flight"
    ids = [echomq.ids.mint() for _ in range(batch)]
    spent = dict.fromkeys(STEPS, 0.0)
    for _ in range(n // batch):
        reply = [[], [], [[i.encode(), b'["noop",[]]', b"1", None] for i in ids]]
        t0 = time.thread_time()
        jobs = _p.settle(keys, [], [], batch, 30_000).decode(reply).jobs
        t1 = time.thread_time()
        w._slots.acquire(batch)
        for job in jobs:
            w._start(ql, job)
        t2 = time.thread_time()
        await asyncio.sleep(0)  # the handlers' tasks run
        await asyncio.sleep(0)
        t3 = time.thread_time()
        settles, ql.settles = ql.settles, []
        good, call = ql.checked_call(settles, batch)
        t4 = time.thread_time()
        w.stats.count_call(good, call.decode([[1] * len(good), [], []]), "micro")
        t5 = time.thread_time()
        for step, dt in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            spent[step] += dt
    return {step: s / n * 1e6 for step, s in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)
    runs = [asyncio.run(one_pass(a.n, a.batch)) for _ in range(a.repeat)]
    best = min(runs, key=lambda r: sum(r.values()))
    steps = "  ".join(f"{k} {v:.2f}" for k, v in best.items())
    print(f"{echomq.__file__}\n{steps}  total {sum(best.values()):.2f} us/job")


if __name__ == "__main__":
    main()
