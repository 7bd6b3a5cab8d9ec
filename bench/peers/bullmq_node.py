"""BullMQ on Node (npm ``bullmq`` + ``ioredis`` in bench/node), one worker process."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from peers._common import QUEUE

LABEL = "BullMQ (Node)"
SETTINGS = (
    "`node bench/peers/bullmq_node/worker.mjs URL C` = `new Worker('bench', fn, {connection, "
    "concurrency: C})` (one Node process, defaults otherwise: completed jobs kept); single = "
    "`await queue.add('noop', {i})`; bulk = `await queue.addBulk([...])`; completion = ZCARD "
    "bull:bench:completed"
)
BULK: str | None = "Queue.addBulk"
CONCURRENCY: dict[int, str | None] = {}

HERE = Path(__file__).resolve().parent / "bullmq_node"
NODE_MODULES = HERE.parent.parent / "node" / "node_modules"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH")
    if not (NODE_MODULES / "bullmq").is_dir() or not (NODE_MODULES / "ioredis").is_dir():
        raise RuntimeError("bench/node/node_modules lacks bullmq/ioredis: run bench/setup.sh")
    return node


def available() -> None:
    """Raises when Node or the npm packages are missing (so run.py can say why)."""
    _node()


def version() -> str:
    pkg = json.loads((NODE_MODULES / "bullmq" / "package.json").read_text())
    io = json.loads((NODE_MODULES / "ioredis" / "package.json").read_text())
    node = subprocess.run([_node(), "--version"], capture_output=True, text=True, check=True)
    return f"{pkg['version']} (ioredis {io['version']}, node {node.stdout.strip()})"


def _produce(*args: object) -> dict[str, Any]:
    proc = subprocess.run(
        [_node(), str(HERE / "produce.mjs"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"produce.mjs {args[0]} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def enqueue_single(url: str, n: int) -> float:
    return float(_produce("single", url, n)["elapsed"])


def enqueue_bulk(url: str, n: int) -> float:
    return float(_produce("bulk", url, n)["elapsed"])


def worker_cmd(url: str, concurrency: int) -> list[str]:
    return [_node(), str(HERE / "worker.mjs"), url, str(concurrency)]


def remaining(url: str, r: Any, n: int) -> int:
    return n - int(r.zcard(f"bull:{QUEUE}:completed"))


def latency_send(url: str, r: Any, rate: float, seconds: float) -> int:
    return int(_produce("latency", url, rate, seconds)["sent"])
