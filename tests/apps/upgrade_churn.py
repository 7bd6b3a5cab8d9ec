"""The retired record's rotation, driven by a release's own batch worker:
``python -m apps.upgrade_churn <count>`` enqueues ``count`` no-op jobs into the contract
test's queue (``enqueue_many``, 1,000 a call) and claims and completes them
(``claim_batch`` + ``complete_many``, the transitions a worker's batch settles use), so the
queue retires ``count`` ids by that release's code. Prints how many it completed itself (the
test's workers may run a few of them first)."""

from __future__ import annotations

import sys

from apps.upgrade_app import QUEUE, app, noop

BATCH = 1000


def main() -> None:
    total = int(sys.argv[1])
    q = app.queue(QUEUE)
    done = 0
    for start in range(0, total, BATCH):
        noop.enqueue_many([((start + i,), {}) for i in range(min(BATCH, total - start))])
        while jobs := q.claim_batch(BATCH, lease_ms=60_000):
            q.complete_many([(j.id, j.token) for j in jobs])
            done += len(jobs)
    print(f"completed {done}")


if __name__ == "__main__":
    main()
