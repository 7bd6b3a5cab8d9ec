"""The model test's sharded leg (issue 43): the model's one logical queue against N shards.

``ShardedMachine`` (tests/model/sharded.py) runs every rule of test_model.py's machine with
each queue opened as ``Queue(name, shards=3)``, the pure model unchanged, and checks after
every step that the shards together are the model's queue (see sharded.py for what is
adapted: rows looked up on their shard and routed there, claims served per shard, the
per-shard bounds, and the verbs a sharded queue refuses asserted refused with nothing
written).

Legs: Lua and native (the conftest ``executor`` legs), 6 examples of up to 40 steps each
(``ECHOMQ_MODEL_DEEP=1``: 20x, with twice the steps). The tour of test_model_coverage.py runs
through the sharded machine too, so every rule and every verb it reaches is driven on a
sharded queue on every run, whatever hypothesis draws; fixed scenarios pin the refusals.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from hypothesis.stateful import run_state_machine_as_test

from echomq.client.shards import shard_of
from model.core import LONG
from model.draws import STATS, budget
from model.recording import public_verbs
from model.sharded import N, ShardedMachine
from model.test_model import (  # noqa: F401  (module_server, session_url: the servers)
    Steps,
    module_server,
    session_url,
)
from model.test_model_coverage import NOT_MODELLED, TOUR

pytestmark = pytest.mark.executors

EXAMPLES = 6


def run(client: redis.Redis, executors: tuple[str, ...], examples: int) -> None:
    client.script_flush()
    STATS.clear()
    try:
        run_state_machine_as_test(
            lambda: ShardedMachine(client, executors), settings=budget(examples)
        )
    finally:
        client.close()
        if os.environ.get("ECHOMQ_MODEL_STATS"):
            print(sorted(STATS.items()))


@pytest.mark.timeout(3600)
def test_sharded_machine(redis_url: str, executor: str) -> None:
    run(redis.Redis.from_url(redis_url), (executor,), EXAMPLES)


@pytest.fixture
def sm(redis_url: str, executor: str) -> Iterator[ShardedMachine]:
    client = redis.Redis.from_url(redis_url)
    machine = ShardedMachine(client, (executor,))
    machine.server_agrees_with_model()
    yield machine
    machine.teardown()
    client.close()


def test_the_tour_on_a_sharded_queue(redis_url: str, executor: str) -> None:
    """Every rule of the machine, through the sharded machine (each step checked), and
    every verb of Queue it reaches driven on the sharded queue (its teardown, pause and
    obliterate, included: it checks that no key of any shard is left)."""
    client = redis.Redis.from_url(redis_url)
    sm = ShardedMachine(client, (executor,))
    try:
        sm.server_agrees_with_model()
        s = Steps(sm)
        for name, kw in TOUR:
            getattr(s, name)(**kw)
        sm.teardown()
    finally:
        client.close()
    missing = public_verbs() - sm.calls - set(NOT_MODELLED)
    assert missing == set(), f"verbs the sharded tour never drove: {sorted(missing)}"


def test_the_refused_verbs_write_nothing(sm: ShardedMachine) -> None:
    """limit(n) and rate_limit are refused on every queue with nothing written (the rules
    compare every key of every shard); limit(None) clears."""
    s = Steps(sm)
    s.seed(n=3, g=None)
    for n in (1, None, 3):
        s.limit_queue(qi=0, n=n)
    s.admin(qi=0, what="rate", g="la", n=2)
    s.claim_batch(qi=0, n=3, lease=LONG)  # nothing was limited
    assert sm.m(0).counts()["active"] == 3


def test_a_job_never_moves_between_shards(sm: ShardedMachine) -> None:
    """A waiting job on another shard than a lane's: reassign refuses (ShardsError,
    nothing written); on the lane's shard it moves as on a plain queue."""
    s = Steps(sm)
    for _ in range(12):
        s.enqueue(qi=0, payload=b"x", group=None, delay=None, did=None, mode="simple")
    homes = sm.placed(0, sm.live(0))
    far = [jid for jid, on in homes.items() if on != shard_of("la", N)]
    near = [jid for jid, on in homes.items() if on == shard_of("la", N)]
    assert far and near, homes  # 12 minted ids over 3 shards: both kinds, but for 3**-11
    s.admin(qi=0, what="limit lane", g="la", n=1)
    sm.do_reassign(0, far[0], "la")
    sm.server_agrees_with_model()
    assert sm.m(0).jobs[far[0]].group is None
    s.reassign(qi=0, n=sm.live(0, "pending", "scheduled").index(near[0]) + 1, g="la")
    assert sm.m(0).jobs[near[0]].group == "la"
