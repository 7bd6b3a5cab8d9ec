"""Periodic tasks: one on a fixed interval, one on a cron schedule in a time zone.

Every worker of the app registers them when it starts and fires them in its beat; each
occurrence is enqueued exactly once however many workers run. This script runs one worker
for about three seconds and prints the interval task's runs, each with the time its
occurrence was due.

Run it against any server: ``ECHOMQ_URL=redis://... python examples/periodic.py``, or start
a private one first with ``echomq server`` (in another terminal) and run it with no variable.
"""

from __future__ import annotations

import asyncio
import time

import echomq

app = echomq.App(name="example-periodic")
QUEUE = "example-periodic"


@app.periodic(every_ms=1_000, queue=QUEUE)
def heartbeat() -> None:
    job = echomq.current_job()
    assert job is not None  # always set inside a handler
    # An occurrence's id carries the time it was due (the server's clock), so each run can say
    # which occurrence it is. The wall clock at run time cannot: a busy worker may run two
    # occurrences within one second.
    due = echomq.ids.decode_time_ms(job.id) / 1000
    print("heartbeat due at", time.strftime("%H:%M:%S", time.localtime(due)))


@app.periodic(cron="0 3 * * *", tz="Europe/Berlin", queue=QUEUE)
def nightly_cleanup() -> None:
    print("cleaning up")


async def main() -> None:
    worker = echomq.Worker(app, queues=[QUEUE], beat_ms=100)
    run = asyncio.ensure_future(worker.arun())
    await asyncio.sleep(3.5)
    for rep in await app.aqueue(QUEUE).repeats():
        schedule = f"every {rep.every_ms} ms" if rep.every_ms else f"cron {rep.cron!r} {rep.tz}"
        print("registered:", rep.name, schedule)
    worker.stop()
    await run
    await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
