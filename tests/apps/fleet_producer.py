"""The producers of the fleet-scale test (issue 37): ``python -m apps.fleet_producer QUEUE N
COUNT START_MS OUT_DIR`` imports echomq once and forks N producer processes (so the fleet
starts without N interpreter start-ups, and each child leases its own node: a forked child
never mints on its parent's). Producer ``p`` leases its node (one id minted and dropped),
sleeps until the wall clock reads START_MS (every producer wakes on that millisecond), then
makes COUNT single enqueues through ``ECHOMQ_URL`` (a proxy that drops replies), payload
``p:<seq>``, with the default ``retry_for`` (so the id is the marker and a lost reply is a
resend without a nonce). One JSON line per call to OUT_DIR/producer-<p>.jsonl:
``[seq, id, status]``, or ``[seq, null, error]`` for a call that raised. Exits 0 when every
child did.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import echomq
from echomq.protocol import produce as _produce


def produce(queue: str, p: int, count: int, start_ms: int, out: str) -> None:
    q = echomq.Queue(queue, executor="lua")
    q._x.run(_produce.mint(q._x.minter))  # the node lease, before the barrier
    while (wait := start_ms / 1000 - time.time()) > 0:
        time.sleep(min(wait, 0.05) if wait > 0.002 else 0)
    with open(out, "w") as f:
        for seq in range(count):
            try:
                e = q.enqueue(f"{p}:{seq}".encode())
                line = [seq, e.id, e.status]
            except Exception as exc:
                line = [seq, None, repr(exc)]
            f.write(json.dumps(line) + "\n")
    q.close()


def main() -> None:
    queue, n, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    start_ms, out_dir = int(sys.argv[4]), sys.argv[5]
    pids = []
    for p in range(n):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                produce(queue, p, count, start_ms, os.path.join(out_dir, f"producer-{p}.jsonl"))
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
