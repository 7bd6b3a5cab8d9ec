"""Helpers of the sharded queue tests (test_sharded_*.py): the sharded queue on both classes
and the per-shard truth each test compares it with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import echomq
from conftest import SyncOverAsync
from echomq.client.shards import shard_of

N = 4


@pytest.fixture(params=["sync", "async"])
def sq(request: pytest.FixtureRequest, url: str, qname: str) -> Iterator[Any]:
    """``Queue(qname, shards=4)`` and ``AsyncQueue(qname, shards=4)`` (through the sync
    adapter), so one test body covers both classes."""
    if request.param == "sync":
        queue = echomq.Queue(qname, url=url, shards=N)
        assert isinstance(queue, echomq.ShardedQueue)
        yield queue
        queue.close()
    else:
        aq = echomq.AsyncQueue(qname, url=url, shards=N)
        assert isinstance(aq, echomq.AsyncShardedQueue)
        adapter = SyncOverAsync(aq)
        yield adapter
        adapter.close()


@contextlib.contextmanager
def shard_queues(url: str, names: list[str]) -> Iterator[list[echomq.Queue]]:
    """A plain Queue per shard name: the truth the sharded verbs are checked against."""
    qs = [echomq.Queue(name, url=url) for name in names]
    try:
        yield qs
    finally:
        for q in qs:
            q.close()


def key_for_shard(i: int, n: int, prefix: str = "k") -> str:
    """A routing key (a lane, a dedup id) whose shard is ``i`` of ``n``."""
    return next(f"{prefix}{j}" for j in range(100_000) if shard_of(f"{prefix}{j}", n) == i)


def holder(shards: list[echomq.Queue], job_id: str) -> int:
    """The index of the one shard that has a row for ``job_id`` (asserted: exactly one)."""
    found = [i for i, q in enumerate(shards) if q.job_state(job_id) != "absent"]
    assert len(found) == 1, f"{job_id} is on shards {found}"
    return found[0]
