"""``Queue`` and ``AsyncQueue``: one-line forwarders over the sans-I/O core in ``protocol.calls``.

``AsyncQueue`` is written by hand (``client/async_queue.py``); ``Queue`` is generated from it by
``scripts/gen-sync`` (``client/sync_queue.py``), so the two differ only where the source marks it.
A parity test checks both classes expose the same verbs with the same signatures.
``Queue(name, shards=N)`` (N > 1) is a ``ShardedQueue`` (``client/sync_sharded.py``).
"""

from __future__ import annotations

from echomq.client.async_queue import AsyncQueue
from echomq.client.async_sharded import AsyncShardedQueue
from echomq.client.sync_queue import Queue
from echomq.client.sync_sharded import ShardedQueue

__all__ = ["AsyncQueue", "AsyncShardedQueue", "Queue", "ShardedQueue"]
