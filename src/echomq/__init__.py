"""echomq: a reliable job queue for Python on Valkey/Redis.

A job is one hash row plus membership in exactly one of four sorted sets of its queue; every
transition is one atomic Lua script; ``attempts`` is both the retry count and the fencing
token, so a worker whose lease lapsed can never settle a job another worker now owns.
"""

from __future__ import annotations

from echomq import ids, keyspace
from echomq._compose import FlowAdded, FlowJob, Repeat
from echomq._observe import Event
from echomq._protocol import WIRE_VERSION, Enqueued, Job
from echomq.app import App, Discard, RateLimit, Retry, Task
from echomq.backoff import exponential, fixed, jitter
from echomq.context import JobContext, current_job
from echomq.errors import (
    DurabilityError,
    EchoMQError,
    InvalidArgument,
    InvalidId,
    JobFailed,
    JobGone,
    KindError,
    Locked,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    StaleToken,
    StateError,
    VersionFenceError,
)
from echomq.hooks import Hooks
from echomq.queue import AsyncQueue, Queue
from echomq.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "WIRE_VERSION",
    "App",
    "AsyncQueue",
    "Discard",
    "DurabilityError",
    "EchoMQError",
    "Enqueued",
    "Event",
    "FlowAdded",
    "FlowJob",
    "Hooks",
    "InvalidArgument",
    "InvalidId",
    "Job",
    "JobContext",
    "JobFailed",
    "JobGone",
    "KindError",
    "Locked",
    "PayloadTooLarge",
    "ProtocolError",
    "Queue",
    "RateLimit",
    "RateLimited",
    "Repeat",
    "Retry",
    "StaleToken",
    "StateError",
    "Task",
    "VersionFenceError",
    "Worker",
    "__version__",
    "current_job",
    "exponential",
    "fixed",
    "ids",
    "jitter",
    "keyspace",
]
