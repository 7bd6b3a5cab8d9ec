"""A batch (Sidekiq Pro style): members added while it runs, one of them adding more from
inside the batch, callbacks that each fire once.

Run it against any server: ``ECHOMQ_URL=redis://... python examples/batch.py``, or start a
private one first with ``echomq server`` (in another terminal) and run it with no variable.
"""

from __future__ import annotations

import asyncio
import threading

import echomq

app = echomq.App()
QUEUE = "example-batch"
fired: list[str] = []
done = threading.Event()  # the callbacks run in the worker's threads


@app.task(queue=QUEUE, max_attempts=1)
def resize(n: int, more: int = 0) -> None:
    job = echomq.current_job()
    assert job is not None
    if more:  # a member adds siblings to its own batch (allowed even after close)
        batch = job.batch
        assert batch is not None
        batch.add_many([resize.s(100 + i) for i in range(more)])
    if n == 3:
        raise RuntimeError("image 3 is corrupt")


@app.task(queue=QUEUE)
def notify(kind: str) -> None:
    job = echomq.current_job()
    assert job is not None and job.batch is not None
    fired.append(kind)
    if kind == "complete":
        st = job.batch.status()
        print(f"on_complete: {st.succeeded} resized, {st.dead} dead")
    else:
        print(f"on_{kind} fired")
    if {"complete", "death"} <= set(fired):  # on_success never fires: a member died
        done.set()


async def main() -> None:
    batch = app.batch(
        on_complete=notify.s("complete"),
        on_success=notify.s("success"),
        on_death=notify.s("death"),
        description="thumbnails",
    )
    batch.add_many([resize.s(n) for n in range(5)])
    batch.add(resize.s(5, more=2))
    batch.close()
    print("batch", batch.id, "closed with", batch.status().total, "members so far")
    worker = echomq.Worker(app, queues=[QUEUE], beat_ms=100)
    run = asyncio.ensure_future(worker.arun())
    assert await asyncio.to_thread(done.wait, 30)
    worker.stop()
    await run
    print("fired:", sorted(fired))
    await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
