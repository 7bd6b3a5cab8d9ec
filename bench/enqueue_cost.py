"""Server µs per single enqueue, this tree against another revision, on both executors
(issue 28's before/after): ``INFO commandstats`` of the top-level command only (EVALSHA or
``EMQ.ENQUEUE``: a script's inner commands are inside its time, bench/servertime.py).

    PYTHONPATH=src .venv/bin/python bench/enqueue_cost.py --old-rev main [--batches 100]

One private server per cell (revision x executor x replay marker on or off, each loading its
revision's module; never 6379). The cells take turns a batch of 100 pipelined enqueues at a
time, in a new random order each turn, so a shared machine's load drifts over all of them
alike; each cell's figure is its server's usec / calls at the end. "marker on" is what
``Queue`` sends by default (``retry_for`` > 0: a nonce and a replay marker), "off" is
``retry_for=0``. The figure is the median batch's µs per call (the mean beside it). Each
revision's own ``protocol.calls`` builds its calls (run in a subprocess per revision), so what is
measured is what that revision's client sends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside each revision's checkout: serve one cell, a batch per line read on stdin.
CELL = r"""
import json, sys
import redis
from echomq.protocol import calls as _p
from echomq.protocol.scripts import SCRIPTS
url, executor, replay_ms, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
named = sys.argv[5] == "named"  # a caller-chosen id: the call keeps a nonce and a marker
# --options: every call has a priority and an expiry (issue 38: the named option tail)
opts = {"priority": 5, "ttl_ms": 60_000} if sys.argv[6] == "options" else {}
from echomq import ids
r = redis.Redis.from_url(url)
k = _p.Keys("cost")
sha = r.script_load(SCRIPTS["enqueue"].source)
head = ("EVALSHA", sha) if executor == "lua" else ("EMQ.ENQUEUE",)

def one_batch():
    pipe = r.pipeline(transaction=False)
    plans = []
    for _ in range(batch):
        plan = _p.enqueue(
            k, b"payload", replay_ms=replay_ms, id=ids.mint() if named else None, **opts
        )
        call = next(plan)
        plans.append(plan)
        pipe.execute_command(*head, len(call.keys), *call.keys, *call.args)
    for plan, reply in zip(plans, pipe.execute(), strict=True):
        try:  # the plan learns its answer, as the executor would tell it
            plan.send(reply.decode() if isinstance(reply, bytes) else reply)
        except StopIteration:
            pass

ROW = "cmdstat_evalsha" if executor == "lua" else "cmdstat_emq.enqueue"

def used():
    row = r.info("commandstats").get(ROW, {"usec": 0, "calls": 0})
    return row["usec"], row["calls"]

one_batch()
r.config_resetstat()
per_batch = []
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "stats":
        st = r.info("commandstats")
        row = st[ROW]
        extra = {k: v["calls"] for k, v in st.items() if k in
                 ("cmdstat_time", "cmdstat_pexpire", "cmdstat_pexpireat")}
        print(json.dumps({"usec": row["usec"], "calls": row["calls"], "extra": extra,
                          "per_batch": per_batch}), flush=True)
        break
    u0, c0 = used()
    one_batch()
    u1, c1 = used()
    per_batch.append((u1 - u0) / (c1 - c0))
    print("ok", flush=True)
"""


def checkout(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-rev", default="main")
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument(
        "--named", action="store_true", help="caller-chosen ids (a minted id is its own marker)"
    )
    ap.add_argument("--options", action="store_true", help="every job: priority 5, ttl_ms 60000")
    a = ap.parse_args()
    import random

    tmp = Path(tempfile.mkdtemp(prefix="echomq-enqcost-"))
    trees = {"old": checkout(a.old_rev, tmp / "old"), "new": ROOT}
    for tree in trees.values():
        subprocess.run(["make", "-s", "-C", str(tree / "native")], check=True)
    sys.path.insert(0, str(ROOT / "src"))
    from echomq.server import EmbeddedServer

    cells: dict[tuple[str, str, int], tuple[object, subprocess.Popen[str]]] = {}
    try:
        for ver, tree in trees.items():
            so = tree / "native" / "trafikey.so"
            for ex in ("lua", "native"):
                for rm in (70_000, 0):
                    srv = EmbeddedServer(
                        tmp / f"srv-{ver}-{ex}-{rm}",
                        appendonly=False,
                        args=["--loadmodule", str(so)],
                    ).start()
                    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
                    proc = subprocess.Popen(
                        [
                            *(sys.executable, "-c", CELL, srv.url, ex, str(rm), str(a.batch)),
                            "named" if a.named else "minted",
                            "options" if a.options else "plain",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                        env=env,
                    )
                    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                    cells[(ver, ex, rm)] = (srv, proc)
        keys = list(cells)
        for _ in range(a.batches):
            random.shuffle(keys)
            for key in keys:
                proc = cells[key][1]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                assert proc.stdout.readline().strip() == "ok"
        per: dict[tuple[str, str, int], float] = {}
        print(
            f"command: `PYTHONPATH=src .venv/bin/python bench/enqueue_cost.py --old-rev "
            f"{a.old_rev} --batches {a.batches}{' --named' if a.named else ''}"
            f"{' --options' if a.options else ''}`\n"
        )
        print(
            "| revision | executor | replay marker | server µs per enqueue "
            "| TIME / PEXPIRE / PEXPIREAT calls |"
        )
        print("|---|---|---|---:|---|")
        for key, (_srv, proc) in cells.items():
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("stats\n")
            proc.stdin.flush()
            got = json.loads(proc.stdout.readline())
            # The median batch: a preempted server (a shared machine) inflates a few batches'
            # usec, which the mean would carry.
            per[key] = statistics.median(got["per_batch"])
            x = got["extra"]
            counts = " / ".join(
                str(x.get(f"cmdstat_{c}", 0)) for c in ("time", "pexpire", "pexpireat")
            )
            on = "on" if key[2] else "off"
            print(
                f"| {key[0]} ({a.old_rev if key[0] == 'old' else 'this tree'}) | {key[1]} "
                f"| {on} | {per[key]:.2f} (mean {got['usec'] / got['calls']:.2f}) "
                f"| {counts} (of {got['calls']}) |"
            )
        print()
        for ex in ("lua", "native"):
            for ver in ("old", "new"):
                marker = per[(ver, ex, 70_000)] - per[(ver, ex, 0)]
                print(f"- {ex}, {ver}: the replay marker costs {marker:.2f} µs per enqueue")
            ratio = per[("new", ex, 70_000)] / per[("old", ex, 70_000)]
            print(f"- {ex}: new / old per default enqueue {ratio:.2f}")
    finally:
        for srv, proc in cells.values():
            proc.kill()
            proc.wait()
            srv.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
