"""trafikey's cost per job (issue 41): the instructions the server spends inside the worker's
round trip, EMQ.SETTLE, against settle.lua's EVALSHA on the same jobs, counted by callgrind
(deterministic: no clock, no load). Both queues get the same jobs from the same enqueue, then
are drained in the worker's shape (completions of one batch while claiming the next, three
batches in flight, as a worker at -c 200); only the settles are counted.

Before issue 41's cuts (a second key lookup for every write that first read its key, a C-string
field object made and freed per field per HashGet, eleven lookups of a completed row's fields)
EMQ.SETTLE cost 0.65 of the script's instructions (Redis 7.0.15); after them, 0.51. The bound
sits between: a change that brings back one of those costs fails here.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest
import redis

import echomq
from echomq.server import find_binary, free_port
from native_fixtures import build, wait_for_ping

JOBS = 800
BATCH = 50
BOUND = 0.58  # native / Lua instructions per settled job


def _drain(url: str, queue: str, executor: str) -> None:
    with echomq.Queue(queue, url=url, executor=executor) as q:
        held = collections.deque([q.settle(n=BATCH).jobs for _ in range(4)])
        while any(held):
            done = held.popleft()
            held.append(q.settle(completed=[(j.id, j.token) for j in done], n=BATCH).jobs)
        assert q.counts()["completed"] == JOBS + 1
        assert q.check() == []


def _inclusive(out: Path, function: str) -> int:
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in text.splitlines():
        if line.rstrip().endswith("]") and f":{function} [" in line:
            return int(line.split()[0].replace(",", ""))
    raise AssertionError(f"{function} not in the callgrind profile (a stripped server?)")


@pytest.mark.skipif(shutil.which("callgrind_annotate") is None, reason="no valgrind")
def test_settle_costs_at_most_0_58_of_the_scripts_instructions(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "callgrind.out"
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
        "--toggle-collect=evalShaCommand", "--toggle-collect=emq_cmd_settle",
        find_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", str(tmp_path), "--loadmodule", str(build()),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port, socket_timeout=60)
        wait_for_ping(r, 60, "callgrind server")
        url = f"redis://127.0.0.1:{port}"
        for queue, executor in (("costl", "lua"), ("costn", "native")):
            # The same jobs on both queues, enqueued one way (only the settles are counted);
            # one settled first, so the script's load (EVAL after NOSCRIPT) is not counted.
            with echomq.Queue(queue, url=url, executor="native") as q:
                q.enqueue_many([b"warm"])
            with echomq.Queue(queue, url=url, executor=executor) as q:
                w = q.settle(n=1).jobs
                q.settle(completed=[(j.id, j.token) for j in w], n=0)
            with echomq.Queue(queue, url=url, executor="native") as q:
                q.enqueue_many([str(i).encode() for i in range(JOBS)])
            _drain(url, queue, executor)
        r.shutdown(nosave=True)
    except redis.ConnectionError:
        pass
    finally:
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lua, native = _inclusive(out, "evalShaCommand"), _inclusive(out, "emq_cmd_settle")
    ratio = native / lua
    print(f"settle per job: lua {lua / JOBS:.0f}, native {native / JOBS:.0f} Ir ({ratio:.2f})")
    assert ratio <= BOUND, f"EMQ.SETTLE costs {ratio:.2f} of settle.lua's instructions"
