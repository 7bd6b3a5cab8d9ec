"""Server time per settle call (``INFO commandstats``): a worker-shaped loop of
``Queue.settle(completed=..., n=k)`` over 3,000 jobs for k = 1, 10, 50, on a private server.

    PYTHONPATH=src python bench/settle_cost.py              # the work tree
    PYTHONPATH=/path/to/other/src python bench/settle_cost.py   # another checkout, same probe

Starts its own redis-server on a free port (never 6379) and stops it at the end.
"""

from __future__ import annotations

import socket
import subprocess
import time

import redis
from servertime import top_level_calls, top_level_usec

from echomq import Queue

JOBS = 3000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        r = redis.Redis(port=port)
        q = Queue("probe", url=f"redis://127.0.0.1:{port}/0")
        for k in (1, 10, 50):
            q.enqueue_many([b'{"x":1}'] * JOBS)
            r.config_resetstat()
            t = time.perf_counter()
            held = q.settle(n=k).jobs
            while held:
                held = q.settle(completed=[(j.id, j.token) for j in held], n=k).jobs
            elapsed = time.perf_counter() - t
            # The script calls alone (EVAL the first time, then EVALSHA): their inner commands'
            # rows are inside that time already (bench/servertime.py).
            stats = r.info("commandstats")
            per_call = top_level_usec(stats) / top_level_calls(stats)
            print(f"settle n={k}: {JOBS / elapsed:8.0f} jobs/s, server {per_call:.1f} us/call")
        q.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
