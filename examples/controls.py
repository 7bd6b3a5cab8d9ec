"""Results, dedup, rate limits and cancel in one runnable script (docs/guides/controls.md).

Run it against any server: ``ECHOMQ_URL=redis://127.0.0.1:6390/0 python examples/controls.py``
(without ECHOMQ_URL it uses a running ``echomq server`` of this directory, else localhost).
It uses its own queue, ``controls-example``, and empties it before and after.
"""

from __future__ import annotations

import asyncio
import threading
import time

import echomq

QUEUE = "controls-example"
app = echomq.App()


@app.task(queue=QUEUE, keep_result_ms=60_000)
def add(a: int, b: int) -> int:
    """Keeps its return value for a minute: callers can wait for it."""
    return a + b


@app.task(queue=QUEUE, keep_result_ms=60_000, max_attempts=1)
def fails() -> None:
    raise ValueError("no such account")


@app.task(queue=QUEUE)
def sync_account(account: int) -> None:
    time.sleep(0.05)


calls = {"n": 0}


@app.task(queue=QUEUE, keep_result_ms=60_000, max_attempts=1)
def call_provider() -> str:
    """A handler told "slow down" by an outside API: RateLimit costs no attempt."""
    calls["n"] += 1
    if calls["n"] < 3:
        raise echomq.RateLimit(delay_ms=100)
    return "sent"


@app.task(queue=QUEUE, lease_ms=600)
async def long_report() -> None:
    await asyncio.sleep(60)  # cancelled at its next heartbeat (every lease/3)


def reset(q: echomq.Queue) -> None:
    q.clear_rate_limit()
    q.clear_rate_limit("tenant-7")
    q.drain(include_scheduled=True)


def main() -> None:
    q = app.queue(QUEUE)
    reset(q)
    # The worker runs on its own event loop in a thread here, so one script shows both
    # sides; in production it is its own process: `echomq worker examples.controls:app`.
    worker = echomq.Worker(app, queues=[QUEUE], concurrency=8)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    runner.start()
    try:
        # 1. Results (D17): the worker keeps the return value; wait() is woken by the settle.
        t0 = time.monotonic()
        print("add(2, 3) =", add.enqueue(2, 3).wait(timeout_s=10))
        print(f"  waited {1000 * (time.monotonic() - t0):.1f} ms")
        try:
            fails.enqueue().wait(timeout_s=10)
        except echomq.JobFailed as exc:
            print("fails() died:", exc.error.splitlines()[0])

        # 2. Dedup (D20): one sync per account while one is queued or running.
        first = sync_account.options(dedup="account-42").enqueue(42)
        again = sync_account.options(dedup="account-42").enqueue(42)
        print("dedup:", first.status, "then", again.status, "(same id:", again.id == first.id, ")")

        # 3. Rate limits (D21): a lane limited to 2 jobs per second, and RateLimit in a handler.
        q.rate_limit_lane("tenant-7", 2, 1000)
        for i in range(4):
            sync_account.options(group="tenant-7").enqueue(i)
        time.sleep(0.3)
        print("tenant-7 after 0.3 s:", q.lane_depth("tenant-7"), "of 4 still waiting")
        print(
            "call_provider() =",
            call_provider.enqueue().wait(timeout_s=10),
            "after",
            calls["n"],
            "runs",
        )

        # 4. Cancel (D22): a waiting job is removed, a running one is stopped and dead-lettered.
        later = sync_account.options(delay_ms=60_000).enqueue(7)
        print("cancel a scheduled job:", q.cancel(later.id))
        running = long_report.enqueue()
        while q.job_state(running.id) != "active":
            time.sleep(0.05)
        print("cancel a running job:", q.cancel(running.id))
        while q.job_state(running.id) != "dead":
            time.sleep(0.05)
        print("  it ended dead with:", q.get_job(running.id)["last_error"])  # type: ignore[index]
        q.remove(running.id)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        runner.join(15)
        loop.close()
        reset(q)
        app.close()


if __name__ == "__main__":
    main()
