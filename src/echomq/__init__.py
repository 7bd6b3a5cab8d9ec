"""echomq: a reliable job queue for Python on Valkey/Redis.

Quick start (five lines; the server comes from ``ECHOMQ_URL`` or ``echomq server``)::

    import echomq                                     # tasks.py
    app = echomq.App()
    @app.task()
    def add(x, y): return x + y
    add.enqueue(2, 3)                                 # then run: echomq worker tasks:app

A job is one hash row plus membership in exactly one of four sorted sets of its queue; every
transition is one atomic Lua script; ``attempts`` is both the retry count and the fencing
token, so a worker whose lease lapsed can never settle a job another worker now owns.
See docs/API.md for the whole public surface; modules whose name starts with ``_`` are
private.
"""

from __future__ import annotations

from echomq import ids, keyspace
from echomq.app import App, Task
from echomq.backoff import exponential, fixed, jitter
from echomq.context import JobContext, current_job
from echomq.errors import (
    BadArguments,
    ChainFailed,
    DurabilityError,
    EchoMQError,
    ExecutorUnavailable,
    GroupFailed,
    InvalidArgument,
    InvalidId,
    JobFailed,
    JobGone,
    KindError,
    LayoutFenceError,
    Locked,
    MissingExtra,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    ResultNotKept,
    ResultNotReady,
    ServerNotRunning,
    ServerUnreachable,
    ShardsError,
    StaleToken,
    StateError,
    VersionFenceError,
)
from echomq.hooks import Hooks
from echomq.outcomes import Discard, RateLimit, Retry
from echomq.protocol.compose import FlowAdded, FlowJob, Repeat
from echomq.protocol.kernel import WIRE_VERSION, Completed, Enqueued, Job, Retried, Settled
from echomq.protocol.observe import Event
from echomq.protocol.registry import HeldJob, WorkerInfo
from echomq.queue import AsyncQueue, AsyncShardedQueue, Queue, ShardedQueue
from echomq.tasks.batches import Batch, BatchStatus
from echomq.tasks.workflow_receipts import ChainReceipt, ChordReceipt, GroupReceipt
from echomq.tasks.workflows import Chain, Chord, Group
from echomq.worker import Worker

__version__ = "0.6.0"

__all__ = [
    "WIRE_VERSION",
    "App",
    "AsyncQueue",
    "AsyncShardedQueue",
    "BadArguments",
    "Batch",
    "BatchStatus",
    "Chain",
    "ChainFailed",
    "ChainReceipt",
    "Chord",
    "ChordReceipt",
    "Completed",
    "Discard",
    "DurabilityError",
    "EchoMQError",
    "Enqueued",
    "Event",
    "ExecutorUnavailable",
    "FlowAdded",
    "FlowJob",
    "Group",
    "GroupFailed",
    "GroupReceipt",
    "HeldJob",
    "Hooks",
    "InvalidArgument",
    "InvalidId",
    "Job",
    "JobContext",
    "JobFailed",
    "JobGone",
    "KindError",
    "LayoutFenceError",
    "Locked",
    "MissingExtra",
    "PayloadTooLarge",
    "ProtocolError",
    "Queue",
    "RateLimit",
    "RateLimited",
    "Repeat",
    "ResultNotKept",
    "ResultNotReady",
    "Retried",
    "Retry",
    "ServerNotRunning",
    "ServerUnreachable",
    "Settled",
    "ShardedQueue",
    "ShardsError",
    "StaleToken",
    "StateError",
    "Task",
    "VersionFenceError",
    "Worker",
    "WorkerInfo",
    "__version__",
    "current_job",
    "exponential",
    "fixed",
    "ids",
    "jitter",
    "keyspace",
]

# The exports defined in internal modules (the folders by role, private modules) name the
# public path, so reprs, help(), copies by reference and tracebacks say echomq.Queue, not
# echomq.client.sync_queue.Queue (issue 38).
_INTERNAL = ("protocol", "client", "tasks", "runtime", "ops")
for _name in __all__:
    _obj = globals()[_name]
    _home = getattr(_obj, "__module__", "")
    _parts = _home.split(".") if isinstance(_home, str) else []
    if _parts[:1] == ["echomq"] and (
        _parts[-1].startswith("_") or (len(_parts) > 2 and _parts[1] in _INTERNAL)
    ):
        setattr(_obj, "__module__", __name__)  # noqa: B010 (mypy: a type's __module__)
del _name, _obj, _home, _parts
