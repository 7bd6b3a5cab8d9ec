"""A producer process for the reliability tests: ``python -m apps.producer QUEUE FIRST COUNT
OUT`` enqueues ``chaos.run(n)`` for n in [FIRST, FIRST + COUNT) through ``ECHOMQ_URL``, one
call per job except every 10th call, an ``enqueue_many`` of 5, and writes one JSON line per
call to OUT: ``{"ns": [...], "ids": [...]}`` for a call that returned, ``{"ns": [...],
"error": "..."}`` for one that raised (its jobs may or may not exist).
``EMQ_TEST_PRODUCE_PAUSE_MS`` paces the calls (default 0).
"""

from __future__ import annotations

import json
import os
import sys
import time

import echomq
from reliability import payload


def main() -> None:
    queue, first, count, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    pause = int(os.environ.get("EMQ_TEST_PRODUCE_PAUSE_MS", "0")) / 1000
    q = echomq.Queue(queue, retry_for=120)
    n, end, calls = first, first + count, 0
    with open(out, "w") as f:
        while n < end:
            calls += 1
            ns = list(range(n, min(end, n + 5))) if calls % 10 == 0 else [n]
            n += len(ns)
            try:
                if len(ns) == 1:
                    receipts = [q.enqueue(payload(ns[0]))]
                else:
                    receipts = q.enqueue_many([payload(i) for i in ns])
            except Exception as exc:
                f.write(json.dumps({"ns": ns, "error": repr(exc)}) + "\n")
                continue
            ids = [e.id for e in receipts if isinstance(e, echomq.Enqueued)]
            statuses = [e.status for e in receipts if isinstance(e, echomq.Enqueued)]
            f.write(json.dumps({"ns": ns, "ids": ids, "statuses": statuses}) + "\n")
            f.flush()
            time.sleep(pause)
    q.close()


if __name__ == "__main__":
    main()
