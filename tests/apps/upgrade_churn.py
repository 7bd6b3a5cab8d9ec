"""The retired record's rotation, driven by a release's own batch worker (run under that
release): ``python -m apps.upgrade_churn MODE [COUNT ...]``.

- ``prepare STAGE FILL``: enqueue STAGE no-op jobs into the lane ``filler``, paused first,
  so no worker runs them yet; then enqueue FILL no-op jobs into the flat set and complete
  them at once, so the queue retires FILL ids by this release's code (the test fills the
  record's current generation close to its 25,000 ids this way, before a resend waits).
- ``run``: wait for the test's go (a push to ``emqtest:<queue>:go``: the process is started
  before the window it must work in, so its start-up is not part of it), then resume
  ``filler`` and complete every job in it.

Enqueues go 1,000 a call (``enqueue_many``); completions are ``claim_batch`` +
``complete_many`` (the transitions a worker's batch settles use). Prints how many jobs it
completed itself (the test's workers may run a few of them first)."""

from __future__ import annotations

import sys
import time

from apps.upgrade_app import QUEUE, app, books, noop

BATCH = 1000
LANE = "filler"


def complete_all() -> int:
    q = app.queue(QUEUE)
    done = 0
    while jobs := q.claim_batch(BATCH, lease_ms=60_000):
        q.complete_many([(j.id, j.token) for j in jobs])
        done += len(jobs)
    return done


def enqueue(count: int, group: str | None = None, *, complete: bool = False) -> int:
    done = 0
    for start in range(0, count, BATCH):
        calls = [((start + i,), {}) for i in range(min(BATCH, count - start))]
        noop.enqueue_many(calls, group=group)
        if complete:
            done += complete_all()
    return done


def main() -> None:
    mode = sys.argv[1]
    started = time.monotonic()
    q = app.queue(QUEUE)
    if mode == "prepare":
        q.pause_lane(LANE)
        enqueue(int(sys.argv[2]), LANE)
        done = enqueue(int(sys.argv[3]), complete=True)
    elif mode == "run":
        assert books().blpop([f"emqtest:{QUEUE}:go"], timeout=300), "no go from the test"
        started = time.monotonic()
        q.resume_lane(LANE)
        done = complete_all()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"{mode}: completed {done} in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
