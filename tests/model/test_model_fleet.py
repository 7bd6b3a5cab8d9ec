"""The model grows to the fleet (issue 37): several producers mint into one queue, with
lost replies and resends, next to the pure model of tests/model/core.py (``QueueModel``:
the queue's rows, and the retired record a resend reads).

Every producer is an ``ids.Minter``; all of them read one clock that the machine moves
(``tick``, and 1 ms every 4th reading), so minters on one node mint the same ids in the
same millisecond.

- *Leased* leg: each producer leases its own node from the server. No id is ever minted
  twice (each enqueue lands its first id), whatever the clock, and a worker completes jobs
  between enqueues, so resends meet retired ids too.
- *Pinned* leg: the producers are pinned to one node (a lease lost on a failover, or a 0.5
  producer among 0.6 ones): ids collide. A first copy that meets another call's row is
  refused (``duplicate``) and the client mints anew; a resend whose first copy was lost
  finds another call's row and is not told ``replayed`` (its payload differs): it mints
  anew. The worker runs only once the producers are done (``finish``): a resend that finds
  only another call's *retired* id still answers ``replayed`` (the retired record holds no
  call identity; see docs/RELIABILITY.md "Minted ids in a fleet"), a limit this leg does
  not walk into and ``tests/protocol/test_fleet_ids.py`` pins as an expected failure.

After every step: the queue's rows are exactly the model's (ids and payloads), ``check()``
is clean, every retired id of the model is in the server's record, and every acknowledged
enqueue is either waiting under the id it was acknowledged with, holding its own payload,
or has run exactly once.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests.model.core import Job, QueueModel

import echomq
from echomq import ids, keyspace
from echomq.protocol import calls as _p
from echomq.protocol.kernel import Call, Replay

pytestmark = pytest.mark.executors

PRODUCERS = 3
_names = itertools.count()


def _pin(m: ids.Minter, node: int) -> None:
    """Make ``m`` mint on ``node`` without a lease (what a lost lease or a 0.5 producer
    amounts to): its ids collide with the node's holder's."""
    with m.lock:
        m.node = node
        m.valid_until = m.renew_at = time.monotonic() + 3600
        m.hw = 1 << 41


class FleetMachine(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis, executor: str, pinned: bool) -> None:
        super().__init__()
        self.r = client
        self.pinned = pinned
        self.q = echomq.Queue(f"fleet{next(_names)}", client=client, executor=executor)
        self.model = QueueModel()
        self.minters = [ids.Minter() for _ in range(PRODUCERS)]
        # One clock for every minter (ids._wall_ms): it moves by `tick`, and by 1 ms every
        # 4th reading (so a minter that re-mints after collisions gets past them, as on a
        # real clock), never by itself: hypothesis replays a sequence exactly.
        self.now = ids._wall_ms()
        self.reads = 0
        self._wall = ids._wall_ms
        ids._wall_ms = self._read  # type: ignore[assignment]
        self.acked: dict[bytes, str] = {}  # payload -> the id its enqueue answered
        self.ran: dict[bytes, int] = {}
        self.sent = 0
        self.finished = False

    def _read(self) -> int:
        self.reads += 1
        if self.reads % 4 == 0:
            self.now += 1
        return self.now

    def teardown(self) -> None:
        ids._wall_ms = self._wall  # type: ignore[assignment]

    # ------------------------------------------------------------------ driving a plan

    def _step(self, step: Any) -> Any:
        if isinstance(step, list):
            return self.q._x.pipeline(step)
        return self.q._x.call(step)

    @rule()
    def tick(self) -> None:
        self.now += 1

    @precondition(lambda self: not self.finished)
    @rule(
        p=st.integers(0, PRODUCERS - 1),
        fate=st.sampled_from(["ok", "ok", "lost_before", "lost_after", "lost_twice"]),
    )
    def enqueue(self, p: int, fate: str) -> None:
        m = self.minters[p]
        if self.pinned and p > 0 and self.minters[0].node is not None:
            _pin(m, self.minters[0].node)
        payload = f"{p}:{self.sent}".encode()
        self.sent += 1
        plan = _p.enqueue(self.q._k, payload, replay_ms=70_000, minter=m)
        losses = {"ok": 0, "lost_before": 1, "lost_after": 1, "lost_twice": 2}[fate]
        first: str | None = None
        step = next(plan)
        try:
            while True:
                one = step[0] if isinstance(step, list) else step
                assert isinstance(one, Call) and one.script is not None
                if one.script.name == "enqueue":
                    first = first or str(one.args[1])
                    if losses:
                        losses -= 1
                        if fate != "lost_before":
                            self._step(step)  # it landed (or was refused); the reply is lost
                        step = plan.throw(Replay(redis.ConnectionError("reply lost")))
                        continue
                step = plan.send(self._step(step))
        except StopIteration as stop:
            got = stop.value
        assert got.status == "enqueued", got
        if not self.pinned:
            # Leased nodes: no other call ever held the id this call minted first.
            assert got.id == first
        assert got.id not in self.model.jobs, "acknowledged for another call's row"
        self.model.admit(got.id, Job(payload, None))
        self.acked[payload] = got.id

    def _work(self, n: int) -> None:
        for job in self.q.claim_batch(n, lease_ms=60_000):
            mine = self.model.jobs.get(job.id)
            assert mine is not None and mine.payload == job.payload, job.id
            self.model.take(job.id)
            self.q.complete(job.id, job.token)
            self.model.drop(job.id)
            self.ran[job.payload] = self.ran.get(job.payload, 0) + 1

    @precondition(lambda self: not self.pinned)
    @rule(n=st.integers(1, 4))
    def work(self, n: int) -> None:
        self._work(n)

    @precondition(lambda self: self.pinned and not self.finished)
    @rule()
    def finish(self) -> None:
        self._work(1000)
        self.finished = True

    # ------------------------------------------------------------------ agreement

    @invariant()
    def agrees(self) -> None:
        waiting = [m.decode() for m in self.r.zrange(self.q._k.pending, 0, -1)]
        rows = {jid: self.r.hget(self.q._k.job(jid), "payload") for jid in waiting}
        assert rows == {jid: j.payload for jid, j in self.model.jobs.items()}
        assert self.q.check() == []
        base = keyspace.base(self.q.name)
        record = set(self.r.hkeys(base + "retired")) | set(self.r.hkeys(base + "retired:old"))
        assert {jid.encode() for jid in self.model.retired} <= record
        for payload, jid in self.acked.items():
            held = self.model.jobs.get(jid)
            waiting_here = held is not None and held.payload == payload
            assert self.ran.get(payload, 0) + waiting_here == 1, (payload, jid)


def budget() -> settings:
    return settings(
        max_examples=10,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        # ECHOMQ_MODEL_NOSHRINK=1: the first failure unshrunk (as tests/model/test_model.py).
        phases=[Phase.explicit, Phase.generate]
        if os.environ.get("ECHOMQ_MODEL_NOSHRINK")
        else list(Phase),
    )


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("pinned", [False, True], ids=["leased", "pinned"])
def test_fleet_machine(client: redis.Redis, executor: str, pinned: bool) -> None:
    run_state_machine_as_test(lambda: FleetMachine(client, executor, pinned), settings=budget())
