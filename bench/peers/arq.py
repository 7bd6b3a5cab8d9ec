"""arq: asyncio worker, ``max_jobs=C``, ``poll_delay=0.001``, one process.

arq pins redis-py < 6 while the newest releases of the other peers need redis-py >= 6.2, so
arq lives in its own venv (``bench/.venv-arq``): the harness calls this module's producer
functions through ``python -m peers._produce arq ...`` and starts the worker with that venv's
interpreter. Completion is read by the harness itself (ZCARD arq:queue), no arq needed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from peers._common import WARMUP, apaced, bench_url, record, wait_warm

LABEL = "arq"
POLL_DELAY = 0.001
SETTINGS = (
    f"`arq.worker.Worker(functions=[noop], max_jobs=C, poll_delay={POLL_DELAY})` run in one "
    "process (`Worker.run()`, logging at WARNING; own venv `bench/.venv-arq` with redis-py 5, "
    "which arq requires); arq polls its queue (a sorted set) and starts at most max_jobs jobs "
    "per poll, so its default poll_delay of 0.5 s would cap c=1 at ~2 jobs/s — the bench uses "
    f"{POLL_DELAY} s; default keep_result (1 h); single = `await pool.enqueue_job('noop', i)`; "
    "no bulk API; completion = ZCARD arq:queue (a job leaves it when it finishes)"
)
BULK: str | None = None
CONCURRENCY: dict[int, str | None] = {}
QUEUE_KEY = "arq:queue"
VENV = Path(__file__).resolve().parent.parent / ".venv-arq"


def _python() -> str:
    py = VENV / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"{VENV} is missing: run bench/setup.sh")
    return str(py)


def _remote(mode: str, url: str, *args: object) -> Any:
    proc = subprocess.run(
        [_python(), "-m", "peers._produce", "arq", mode, url, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"arq {mode} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def available() -> None:
    _python()


# ------------------------------------------------------------------ harness side


def version() -> str:
    return str(_remote("version", bench_url()))


def enqueue_single(url: str, n: int) -> float:
    return float(_remote("enqueue_single", url, n))


def enqueue_bulk(url: str, n: int) -> float:
    raise NotImplementedError


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [_python(), "-m", "peers._worker", "arq", str(concurrency)]


def remaining(url: str, r: Any, n: int) -> int:
    return int(r.zcard(QUEUE_KEY))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    return int(_remote("latency_send", url, rate, seconds))


# ------------------------------------------------------------------ inside bench/.venv-arq


async def noop(ctx: dict[str, Any], i: int, t: float = 0.0) -> None:
    if t:
        record(t)


def local_version() -> str:
    from importlib.metadata import version as _version

    return f"{_version('arq')} (redis-py {_version('redis')})"


async def _pool(url: str) -> Any:
    from arq import create_pool
    from arq.connections import RedisSettings

    return await create_pool(RedisSettings.from_dsn(url))


def local_enqueue_single(url: str, n: int) -> float:
    async def main() -> float:
        pool = await _pool(url)
        await pool.ping()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(n):
            await pool.enqueue_job("noop", i)
        elapsed = loop.time() - t0
        await pool.aclose()
        return elapsed

    return asyncio.run(main())


def local_latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    async def main() -> int:
        pool = await _pool(url)
        await pool.enqueue_job("noop", 0, t=WARMUP)
        await asyncio.to_thread(wait_warm, r)
        sent = await apaced(lambda t: pool.enqueue_job("noop", 0, t=t), rate, seconds)
        await pool.aclose()
        return sent

    return asyncio.run(main())


def run_worker(concurrency: int) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    asyncio.set_event_loop(asyncio.new_event_loop())
    Worker(
        functions=[func(noop, name="noop")],
        redis_settings=RedisSettings.from_dsn(bench_url()),
        max_jobs=concurrency,
        poll_delay=POLL_DELAY,
        handle_signals=True,
    ).run()


if __name__ == "__main__":
    sys.exit("use bench/run.py")
