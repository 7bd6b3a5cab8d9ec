"""Workflows: a chain (steps in sequence, each given the previous value), a group (values in
order) and a chord (a group, then a callback given its values), over two queues.

Run it against any server: ``ECHOMQ_URL=redis://... python examples/chain.py``, or start a
private one first with ``echomq server`` (in another terminal) and run it with no variable.
"""

from __future__ import annotations

import asyncio

import echomq

app = echomq.App()


@app.task(queue="example-orders")
def price(order_id: int) -> int:
    return 100 * order_id


@app.task(queue="example-orders")
def add_tax(amount: int, rate: float = 0.2) -> float:
    return amount * (1 + rate)


@app.task(queue="example-billing")
def invoice(total: float) -> str:
    return f"invoice for {total:.2f}"


@app.task(queue="example-billing")
def total(amounts: list[int]) -> int:
    return sum(amounts)


@app.task(queue="example-orders", max_attempts=1)
def reserve(amount: int) -> int:
    raise ValueError(f"no stock for {amount}")


async def main() -> None:
    chain = await (price.s(3) | add_tax.s(rate=0.5) | invoice.s()).aenqueue()
    group = await app.group([price.s(i) for i in (1, 2, 3)]).aenqueue()
    chord = await (app.group([price.s(i) for i in (4, 5)]) | total.s()).aenqueue()
    failing = await (price.s(1) | reserve.s() | invoice.s()).aenqueue()
    worker = echomq.Worker(app, queues=["example-orders", "example-billing"], beat_ms=100)
    run = asyncio.ensure_future(worker.arun())
    try:
        print("chain:", await chain.await_result(timeout_s=30))
        print("group:", await group.await_result(timeout_s=30))
        print("chord:", await chord.await_result(timeout_s=30))
        try:
            await failing.await_result(timeout_s=30)
        except echomq.ChainFailed as exc:
            print(f"failed at step {exc.step}: {exc.error.splitlines()[0]}")
    finally:
        worker.stop()
        await run
        await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
