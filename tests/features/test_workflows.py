"""Issue 42 (part 1): chain, group and chord on flows, run by a real in-process Worker on
both executors. Every run of a step is recorded server-side (a list per test), so "later
steps never ran" is read from the server, not from the receipt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

import echomq
from conftest import running, snapshot
from echomq import (
    App,
    BadArguments,
    Chain,
    ChainFailed,
    GroupFailed,
    InvalidArgument,
    StateError,
    Worker,
    ids,
)

pytestmark = pytest.mark.executors


@pytest.fixture
def app(url: str, qname: str, redis_url: str) -> Iterator[App]:
    """Tasks on two queues (``qname`` and ``qname-b``); each run appends ``task:arg`` to the
    list ``emqtest:<qname>:runs``. ``boom`` fails for good (max_attempts=2)."""
    a = App(url=url)
    books = redis.Redis.from_url(redis_url)
    runs = f"emqtest:{qname}:runs"

    def record(name: str, value: object) -> None:
        books.rpush(runs, f"{name}:{value}")

    @a.task(queue=qname, name="add")
    def add(x: int, y: int = 0) -> int:
        record("add", x)
        return x + y

    @a.task(queue=qname + "-b", name="double")
    def double(x: int) -> int:
        record("double", x)
        return 2 * x

    @a.task(queue=qname, name="total")
    async def total(values: list[int]) -> int:
        record("total", values)
        return sum(values)

    @a.task(queue=qname + "-b", name="boom", max_attempts=2, backoff=0)
    def boom(x: int) -> int:
        record("boom", x)
        raise ValueError(f"no luck with {x}")

    @a.task(queue=qname, name="label")
    def label(prefix: str, value: int) -> str:
        record("label", value)
        return f"{prefix}={value}"

    @a.task(queue=qname, name="const", inline=True)
    def const(word: str) -> str:
        record("const", word)
        return word

    yield a
    a.close()
    books.close()


def _runs(r: redis.Redis, qname: str) -> list[str]:
    return [x.decode() for x in r.lrange(f"emqtest:{qname}:runs", 0, -1)]


def _worker(app: App, qname: str) -> Worker:
    return Worker(app, queues=[qname, qname + "-b"], beat_ms=50)


def test_chain_passes_each_value_on_across_two_queues(app: App, qname: str, r: redis.Redis) -> None:
    add, double = app.tasks["add"], app.tasks["double"]
    chain = add.s(1, 2) | double.s() | add.s(10) | double.s() | add.s(y=1)
    assert isinstance(chain, Chain) and len(chain.steps) == 5
    receipt = chain.enqueue()
    assert len(set(receipt.ids)) == 5 and all(ids.is_valid(i) for i in receipt.ids)
    assert receipt.queues == [qname, qname + "-b", qname, qname + "-b", qname]
    # Nothing past the first step is claimable before it runs.
    assert receipt.status() == ["pending", *["awaiting_children"] * 4]
    with running(_worker(app, qname)):
        assert receipt.wait(timeout_s=60) == ((1 + 2) * 2 + 10) * 2 + 1  # 33
    assert _runs(r, qname) == ["add:1", "double:3", "add:6", "double:16", "add:32"]
    assert receipt.status() == ["completed"] * 5
    assert receipt.failed_step() is None
    for name in (qname, qname + "-b"):
        assert app.queue(name).check() == []
        assert app.queue(name).counts()["pending"] == 0


def test_app_chain_with_an_immutable_inline_step(app: App, qname: str, r: redis.Redis) -> None:
    add, const = app.tasks["add"], app.tasks["const"]
    receipt = app.chain(add.s(5), const.si("fixed"), keep_result_ms=60_000).enqueue()
    with running(_worker(app, qname)):
        assert receipt.wait(timeout_s=60) == "fixed"  # an inline task keeps the step's value
    assert _runs(r, qname) == ["add:5", "const:fixed"]  # the step ran after, ignoring 5


def test_chain_arg_passes_the_value_as_a_keyword(app: App, qname: str, r: redis.Redis) -> None:
    add, label = app.tasks["add"], app.tasks["label"]
    receipt = (add.s(2, 4) | label.s("total").options(chain_arg="value")).enqueue()
    with running(_worker(app, qname)):
        assert receipt.wait(timeout_s=60) == "total=6"
    assert _runs(r, qname) == ["add:2", "label:6"]
    with pytest.raises(InvalidArgument, match="chain_arg"):
        label.s("x").options(chain_arg="not a name")
    with pytest.raises(BadArguments, match="chain step 1"):
        app.chain(add.s(1), label.s("x").options(chain_arg="nope"))


def test_a_dead_step_stops_the_chain(app: App, qname: str, r: redis.Redis) -> None:
    add, boom, double = app.tasks["add"], app.tasks["boom"], app.tasks["double"]
    receipt = (add.s(1) | boom.s() | double.s() | add.s()).enqueue()
    with running(_worker(app, qname)), pytest.raises(ChainFailed) as info:
        receipt.wait(timeout_s=60)
    err = info.value
    assert (err.step, err.job_id) == (1, receipt.ids[1])
    assert "ValueError: no luck with 1" in err.error
    assert isinstance(err, echomq.JobFailed) and err.ids == receipt.ids
    # boom ran twice (its two attempts); the steps after it never ran.
    assert _runs(r, qname) == ["add:1", "boom:1", "boom:1"]
    assert receipt.status()[:2] == ["completed", "dead"]
    assert receipt.status()[2:] == ["dead", "dead"]  # killed by their child's death
    found = receipt.failed_step()
    assert found is not None and (found.step, found.job_id) == (1, receipt.ids[1])


async def test_async_chain_and_group(app: App, qname: str, r: redis.Redis) -> None:
    add, double = app.tasks["add"], app.tasks["double"]
    chain = await (add.s(2) | double.s()).aenqueue()
    group = await app.group([double.s(i) for i in range(5)]).aenqueue()
    worker = _worker(app, qname)
    run = asyncio.ensure_future(worker.arun())
    try:
        assert await chain.await_result(timeout_s=60) == 4
        assert await group.await_result(timeout_s=60) == [0, 2, 4, 6, 8]
        assert await chain.astatus() == ["completed", "completed"]
        assert await chain.afailed_step() is None
    finally:
        worker.stop()
        await run
        await app.aclose()


def test_group_values_in_order_and_every_failure_attached(
    app: App, qname: str, r: redis.Redis
) -> None:
    double, boom = app.tasks["double"], app.tasks["boom"]
    good = app.group([double.s(i) for i in (3, 1, 2)]).enqueue()
    bad = app.group([double.s(1), boom.s(7), double.s(2), boom.s(8)]).enqueue()
    with running(_worker(app, qname)):
        assert good.wait(timeout_s=60) == [6, 2, 4]
        with pytest.raises(GroupFailed) as info:
            bad.wait(timeout_s=60)
    err = info.value
    assert err.failed_ids == [bad.ids[1], bad.ids[3]]
    assert [e.job_id for e in err.exceptions] == err.failed_ids
    assert "no luck with 7" in err.exceptions[0].error
    assert "no luck with 8" in err.exceptions[1].error
    assert err.values == [2, None, 4, None]
    assert [f.job_id for f in bad.failures()] == err.failed_ids


def test_chord_callback_after_the_group_with_values_in_order(
    app: App, qname: str, r: redis.Redis
) -> None:
    double, total, add = app.tasks["double"], app.tasks["total"], app.tasks["add"]
    chord = app.group([double.s(i) for i in (5, 1, 3)]) | total.s()
    receipt = chord.enqueue()
    chained = (app.chord(app.group([double.s(1), double.s(2)]), total.s()) | add.s(100)).enqueue()
    with running(_worker(app, qname)):
        assert receipt.wait(timeout_s=60) == 18
        assert receipt.members.wait(timeout_s=60) == [10, 2, 6]
        assert chained.wait(timeout_s=60) == 106
    runs = _runs(r, qname)
    assert "total:[10, 2, 6]" in runs  # the callback got the values in the group's order
    assert runs.index("total:[10, 2, 6]") > max(runs.index(f"double:{i}") for i in (5, 1, 3))


def test_chord_member_death_fails_the_callback(app: App, qname: str, r: redis.Redis) -> None:
    double, total, boom = app.tasks["double"], app.tasks["total"], app.tasks["boom"]
    receipt = (app.group([double.s(1), boom.s(2)]) | total.s()).enqueue()
    with running(_worker(app, qname)), pytest.raises(GroupFailed) as info:
        receipt.wait(timeout_s=60)
    assert info.value.failed_ids == [receipt.members.ids[1]]
    assert not any(x.startswith("total") for x in _runs(r, qname))


def test_bad_input_is_refused_and_nothing_is_written(app: App, qname: str, r: redis.Redis) -> None:
    add, double, total = app.tasks["add"], app.tasks["double"], app.tasks["total"]
    with pytest.raises(InvalidArgument, match="at least one"):
        app.chain()
    with pytest.raises(InvalidArgument, match="task signatures"):
        app.chain(add.s(1), "double")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must be a task signature"):
        add.s(1) | 3
    with pytest.raises(BadArguments, match="chain step 0"):
        app.chain(double.s(), add.s())  # the first step receives nothing
    with pytest.raises(BadArguments, match=r"chain step 1.*task\.si"):
        app.chain(add.s(1), add.s(1, 2))  # no room for the previous value
    with pytest.raises(BadArguments):
        app.flow(double.s())  # a partial signature outside a chain is refused when sent
    jid = ids.mint()
    with pytest.raises(InvalidArgument, match="same job id twice"):
        app.chain(add.s(1).options(id=jid), double.s().options(id=jid))
    with pytest.raises(InvalidArgument, match="fail_parent"):
        app.chain(add.s(1), double.s().options(fail_parent=False))
    with pytest.raises(InvalidArgument, match="at most 8 levels"):
        app.chain(add.s(1), *[double.s() for _ in range(8)])
    with pytest.raises(InvalidArgument, match="keep_result_ms"):
        app.chain(add.s(1), keep_result_ms=0)
    with pytest.raises(InvalidArgument, match="at least one"):
        app.group([])
    with pytest.raises(InvalidArgument, match="task signatures"):
        app.group([double.s(1), None])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="group can only come first"):
        add.s(1) | app.group([double.s(1)])
    with pytest.raises(InvalidArgument, match="group \\| x"):
        app.group([double.s(1)]) | app.group([double.s(2)])
    with pytest.raises(InvalidArgument, match="group can only come first"):
        (add.s(1) | double.s()) | app.group([double.s(1)])
    with pytest.raises(BadArguments, match="group member 1"):
        app.group([double.s(1), double.s()])  # a member receives no previous value
    with pytest.raises(InvalidArgument, match="chord can only be a chain's first step"):
        add.s(1) | app.chord(app.group([double.s(1)]), total.s())
    with pytest.raises(BadArguments, match="callback"):
        app.chord(app.group([double.s(1)]), add.s(1, 2))
    # An id a job already holds: StateError, nothing of the chain written (even across queues).
    held = add.enqueue(1)
    before = snapshot(r, qname), snapshot(r, qname + "-b")
    with pytest.raises(StateError, match="exists"):
        app.chain(add.s(1), double.s(), add.s().options(id=held.id)).enqueue()
    with pytest.raises(StateError, match="exists"):
        app.chain(add.s(1).options(id=held.id), double.s()).enqueue()
    with pytest.raises(StateError, match="exists"):
        app.group([double.s(1), add.s(1).options(id=held.id)]).enqueue()
    assert (snapshot(r, qname), snapshot(r, qname + "-b")) == before
