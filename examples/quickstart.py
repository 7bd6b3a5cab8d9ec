"""The README's quick start as one runnable script: a task, a worker, an enqueue, its result.

Run it against any server: ``ECHOMQ_URL=redis://127.0.0.1:6390/0 python examples/quickstart.py``
(without ECHOMQ_URL it uses a running ``echomq server`` of this directory, else localhost).
It uses its own queue, ``quickstart-example``, and empties it before and after.
"""

from __future__ import annotations

import asyncio
import threading

import echomq

QUEUE = "quickstart-example"
app = echomq.App()


@app.task(queue=QUEUE, keep_result_ms=60_000)
def send_welcome(to: str) -> str:
    return f"welcome mail sent to {to}"


def main() -> None:
    q = app.queue(QUEUE)
    q.drain(include_scheduled=True)
    # In production the worker is its own process: `echomq worker examples.quickstart:app`.
    # Here it runs on its own event loop in a thread, so one script shows both sides.
    worker = echomq.Worker(app, queues=[QUEUE], concurrency=4)
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    runner.start()
    try:
        receipt = send_welcome.enqueue("ada@example.com")
        print("enqueued:", receipt.status)
        print("result:", receipt.wait(timeout_s=10))
        counts = q.counts()
        print("left:", {k: counts[k] for k in ("pending", "active", "schedule", "dead")})
    finally:
        loop.call_soon_threadsafe(worker.stop)
        runner.join(15)
        loop.close()
        q.drain(include_scheduled=True)
        app.close()


if __name__ == "__main__":
    main()
