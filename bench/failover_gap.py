"""What a failover costs a client already in use, per path (docs/SCALING.md).

    python bench/failover_gap.py [--rounds 3] [lua native lua-durable native-durable]

For each path and round: a 6-node cluster (3 primaries, 1 replica each, every node loading
trafikey, ``cluster-node-timeout`` 1 s; a durable path adds a second replica to the queue's
shard so the promoted replica keeps one), one synchronous producer enqueueing in a loop
(``retry_for=20``), its queue's primary SIGKILLed once it has 200 acknowledged enqueues. Prints
when ``CLUSTER SLOTS`` named the new primary, the longest time between two acknowledged
enqueues, how many were acknowledged in the 2 s after the promotion, and how many raised.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

import echomq
from echomq import keyspace
from echomq.client import native as _native
from echomq.server import EmbeddedServer, free_port
from echomq.testing import EmbeddedCluster

NAME = "gap"


def _owner(c: EmbeddedCluster) -> int:
    slot = keyspace.slot(keyspace.queue_key(NAME, "pending"))
    for node in c.nodes:
        if node.proc is None or node.proc.poll() is not None:
            continue
        try:
            with redis.Redis(port=node.port) as r:
                for start, end, primary, *_ in r.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return int(primary[1])
        except redis.exceptions.RedisError:
            continue
    raise RuntimeError("no live node")


def _add_replica(c: EmbeddedCluster, port: int) -> None:
    node = EmbeddedServer(
        c.dir / "extra",
        port=free_port(cluster=True),
        appendonly=False,
        unix_socket=False,
        args=[
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(c.node_timeout_ms),
            "--repl-diskless-sync-delay", "0",
            *c.args,
        ],
    ).start()  # fmt: skip
    c.nodes.append(node)
    with redis.Redis(port=port) as p, redis.Redis(port=node.port) as r:
        primary = p.execute_command("CLUSTER", "MYID").decode()
        r.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        while primary not in r.execute_command("CLUSTER", "NODES").decode():
            time.sleep(0.05)
        r.execute_command("CLUSTER", "REPLICATE", primary)
        while r.info("replication").get("master_link_status") != "up":
            time.sleep(0.05)


def run(path: str, module: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="emq-gap-") as tmp:
        c = EmbeddedCluster(tmp, node_timeout_ms=1000, args=["--loadmodule", str(module)])
        c.start()
        try:
            durable = path.endswith("-durable")
            if durable:
                _add_replica(c, _owner(c))
            url = f"{c.url}?executor={path.split('-', maxsplit=1)[0]}" + (
                "&durable=1" if durable else ""
            )
            acks: list[float] = []
            errors: list[str] = []
            stop = threading.Event()

            def produce() -> None:
                with echomq.Queue(NAME, url=url, retry_for=20) as q:
                    while not stop.is_set():
                        try:
                            q.enqueue(b"x")
                            acks.append(time.monotonic())
                        except Exception as exc:  # counted, not hidden
                            errors.append(type(exc).__name__)

            producer = threading.Thread(target=produce)
            producer.start()
            while len(acks) < 200:  # in use before the kill (and past its first connect)
                time.sleep(0.01)
            victim = next(n for n in c.nodes if n.port == _owner(c))
            killed = time.monotonic()
            victim.kill()
            while True:
                try:
                    if _owner(c) != victim.port:
                        break
                except RuntimeError:
                    pass
                time.sleep(0.05)
            promoted = time.monotonic() - killed
            time.sleep(2.0)
            stop.set()
            producer.join()
            gap = max(b - a for a, b in itertools.pairwise(acks))
            after = sum(1 for a in acks if a > killed + promoted)
            return {"promoted": promoted, "gap": gap, "errors": errors, "after": after}
        finally:
            c.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "paths", nargs="*", default=["lua", "native", "lua-durable", "native-durable"]
    )
    ns = parser.parse_args()
    module = _native.build(tempfile.mkdtemp(prefix="emq-gap-so-"))
    for _ in range(ns.rounds):
        for path in ns.paths:
            r = run(path, module)
            print(
                f"{path}: promoted {r['promoted']:.2f} s after the kill, longest gap "
                f"{r['gap']:.2f} s, {r['after']} acknowledged enqueues after the promotion, "
                f"{len(r['errors'])} raised {sorted(set(r['errors']))}",
                flush=True,
            )
    sys.exit(0)


if __name__ == "__main__":
    main()
