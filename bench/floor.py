"""Where a single enqueue's time goes: one producer, one call at a time, one server.

    bench/.venv/bin/python bench/floor.py [--n 20000] [--rounds 5]

The server is a private one that loads the trafikey module (built into a temp dir), so the
Lua and native paths, and the peers that are installed (huey in bench/.venv), run against
the same process in one run. Rows, best round of each (the machine is noisy; the best round
is the least disturbed), in rounds that interleave the rows:
- a ``PING`` over a raw socket (no client library): the round trip itself, the ceiling of
  any client that waits for its reply;
- ``PING`` and ``LPUSH`` through redis-py: the client library's share (LPUSH is what huey and
  rq send);
- ``EVALSHA`` of a script that only returns 1: the floor of any one-script verb;
- echomq's enqueue sent raw, as the script and as ``EMQ.ENQUEUE``: the transition's server
  cost on each executor;
- ``Task.enqueue`` on each executor: echomq's whole path (validation, id, replay marker,
  envelope);
- huey's ``task(i)``, when huey is importable.
The last column is the server's own µs per call: ``INFO commandstats`` of the commands the
row sends, around each round of it (the smallest round).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from servertime import usec_of

import echomq
from echomq.client import native as _native
from echomq.protocol import calls as _protocol
from echomq.server import EmbeddedServer


def rate_of(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def server_usec(r: redis.Redis, outer: tuple[str, ...]) -> float:
    """The server's µs so far in the commands a row sends (INFO commandstats). Only those: a
    script's or module's own calls (HSET, ZADD ...) are counted apart as well as inside the
    EVALSHA or EMQ.* time, and summing them would count them twice (bench/servertime.py)."""
    return usec_of(r.info("commandstats"), outer)


def raw_ping(port: int) -> Callable[[], object]:
    """PING over a plain socket: one send, one recv of the 7-byte reply."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"*1\r\n$4\r\nPING\r\n"

    def call() -> object:
        s.sendall(msg)
        got = b""
        while len(got) < 7:
            got += s.recv(64)
        return got

    return call


Row = tuple[str, Callable[[], object], tuple[str, ...]]  # label, one call, what it sends


def huey_row(url: str) -> Row | None:
    try:
        from huey import RedisHuey
    except ImportError:
        return None
    huey = RedisHuey("floor-huey", url=url)

    @huey.task(name="noop")
    def noop(i: int) -> bool:
        return True

    return "huey `task(i)` (pickle + LPUSH through redis-py)", lambda: noop(1), ("lpush",)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    a = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="echomq-floor-"))
    so = _native.build(tmp / "module")
    srv = EmbeddedServer(tmp / "server", appendonly=False, args=["--loadmodule", str(so)])
    srv.start()
    closers: list[Callable[[], Any]] = []
    try:
        r = redis.Redis.from_url(srv.url, single_connection_client=True)
        noop_sha = r.script_load("return 1")
        keys = _protocol.Keys("floor")
        first = next(_protocol.enqueue(keys, b"payload"))
        assert first.script is not None
        sha = r.script_load(first.script.source)

        def raw_script() -> object:
            call = next(_protocol.enqueue(keys, b"payload"))
            return r.execute_command("EVALSHA", sha, len(call.keys), *call.keys, *call.args)

        def raw_native() -> object:
            call = next(_protocol.enqueue(keys, b"payload"))
            return r.execute_command("EMQ.ENQUEUE", len(call.keys), *call.keys, *call.args)

        rows: list[Row] = [
            ("PING over a raw socket (the round trip alone)", raw_ping(srv.port), ("ping",)),
            ("PING via redis-py", lambda: r.execute_command("PING"), ("ping",)),
            ("LPUSH via redis-py (what huey and rq send)", lambda: r.lpush("x", "p"), ("lpush",)),
            ("EVALSHA of `return 1` via redis-py", lambda: r.evalsha(noop_sha, 0), ("evalsha",)),
            ("echomq enqueue, raw EVALSHA of the script", raw_script, ("evalsha",)),
            ("echomq enqueue, raw EMQ.ENQUEUE", raw_native, ("emq.enqueue",)),
        ]
        for executor in ("lua", "native"):
            app = echomq.App(srv.url + f"?executor={executor}")
            closers.append(app.close)
            task = app.task(queue=f"floor-{executor}", name="t")(lambda i: None)
            sends = ("evalsha", "eval") if executor == "lua" else ("emq.enqueue",)
            label = f"echomq `Task.enqueue(i)`, {executor}"
            rows.append((label, lambda task=task: task.enqueue(1), sends))
        peer = huey_row(srv.url)
        if peer is not None:
            rows.append(peer)
        for _label, fn, _sends in rows:  # warm every path (script cache, connections, imports)
            for _ in range(200):
                fn()
        best = dict.fromkeys((row[0] for row in rows), 0.0)
        server_us = dict.fromkeys((row[0] for row in rows), float("inf"))
        for _ in range(a.rounds):
            for label, fn, sends in rows:
                before = server_usec(r, sends)
                best[label] = max(best[label], rate_of(fn, a.n))
                used = server_usec(r, sends) - before
                server_us[label] = min(server_us[label], used / a.n)
        print(f"command: `bench/.venv/bin/python bench/floor.py --n {a.n} --rounds {a.rounds}`\n")
        print("| path | calls/s (best round) | µs per call | server µs per call |")
        print("|---|---:|---:|---:|")
        for label, _fn, _sends in rows:
            print(
                f"| {label} | {best[label]:,.0f} | {1e6 / best[label]:,.0f} "
                f"| {server_us[label]:.1f} |"
            )
        sys.stdout.flush()
    finally:
        for close in closers:
            close()
        srv.stop()


if __name__ == "__main__":
    main()
