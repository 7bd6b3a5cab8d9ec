"""A flow: a parent task that runs once its children are done, with their results.

Run it against any server: ``ECHOMQ_URL=redis://... python examples/flow.py``, or start a
private one first with ``echomq server`` (in another terminal) and run it with no variable.
"""

from __future__ import annotations

import asyncio

import echomq

app = echomq.App()
QUEUE = "example-flow"
done = asyncio.Event()


@app.task(queue=QUEUE, keep_result_ms=60_000)  # children keep results: the parent reads them
def word_count(text: str) -> int:
    return len(text.split())


@app.task(queue=QUEUE)
async def report(title: str) -> None:
    job = echomq.current_job()
    assert job is not None
    counts = await job.achildren_values()  # {child id: return value}
    print(f"{title}: {sum(counts.values())} words in {len(counts)} documents")
    done.set()


async def main() -> None:
    added = app.flow(
        report.s("corpus"),
        children=[word_count.s("a b c"), word_count.s("d e"), word_count.s("f")],
    )
    print("parent", added.parent_id, "waits for", len(added.child_ids), "children")
    worker = echomq.Worker(app, queues=[QUEUE], beat_ms=100)
    run = asyncio.ensure_future(worker.arun())
    await asyncio.wait_for(done.wait(), timeout=30)
    worker.stop()
    await run
    await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
