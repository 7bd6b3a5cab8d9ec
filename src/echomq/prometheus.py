"""Prometheus metrics for echomq (needs ``prometheus_client``: ``pip install 'echomq[web]'``).

Two halves:

- :class:`QueueCollector` reads the server at scrape time (one pipelined snapshot of every
  queue; nothing runs in the workers): per-queue gauges per state and per lane (depth, in
  flight, limit, weight, paused), the age of the oldest waiting job (from its id's mint time),
  the headroom of the earliest lease deadline, the completed/failed totals of ``counts()``
  and, when the settling scripts write them (D16), the last full minute's throughput. A
  sharded queue (issue 43) is one ``queue`` label with its shards' sums, and
  ``echomq_shard_jobs{queue,shard,state}`` breaks its jobs down per shard.
- :class:`PrometheusHooks` measures inside a worker through its lifecycle hooks
  (``Worker(app, hooks=PrometheusHooks().hooks())``): time in queue (claim minus the id's
  mint time) and run time per task, outcomes (completed, retried, dead, lost), and the
  worker's own counts of leases lost (stale-token refusals of extend or settle), stall
  deaths and reaps. A run of a shard is labelled with its logical queue.

Worker metrics are plain counters and histograms, so they are multi-process safe in
``prometheus_client``'s multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR`` (an empty
directory) for every worker process (``echomq worker -c N`` and ``--processes``) and for
``echomq metrics``, which then aggregates the files of every process.

Serve: ``echomq metrics --port 9808``; or mount :func:`metrics_app` in your ASGI app
(``app.mount("/metrics", metrics_app(url))``); the dashboard serves ``/metrics`` too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from echomq.protocol import extras as _extras

# The web extra's own feature: imported only by what serves metrics (echomq metrics, the
# dashboard's /metrics, a worker's --metrics-port); without the extra, one line saying so.
try:
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import REGISTRY, Collector
except ImportError as exc:
    raise _extras.missing("web", "Prometheus metrics (echomq.prometheus)", exc) from exc

from echomq import ids
from echomq.client.executor import SyncExecutor, sync_client
from echomq.hooks import Hooks
from echomq.ops import backlog as _backlog
from echomq.ops import sharded as _sharded
from echomq.ops import snapshots as _inspect
from echomq.runtime.shardset import logical_of

__all__ = [
    "DEFAULT_LANES",
    "OTHER_LANE",
    "PrometheusHooks",
    "QueueCollector",
    "exposition",
    "metrics_app",
    "registry_for",
    "serve",
]

# Seconds: from well under a millisecond (a hot queue) to an hour (a backlog).
TIME_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class QueueCollector(Collector):
    """Gauges and counters of the queues on one server, read at each scrape.

    ``queues``: the names to report (default: every queue found by SCAN, re-discovered at
    most every ``discover_s`` seconds so a scrape never walks a large keyspace each time).
    ``lanes``: the lanes per queue that get a ``lane`` label of their own, the deepest first
    (default :data:`DEFAULT_LANES`); the others are summed into ``lane="~other"`` (``~`` is
    never part of a lane name), so a tenant per lane cannot grow the series without bound.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        queues: Sequence[str] | None = None,
        discover_s: float = 30.0,
        lanes: int | None = None,
    ) -> None:
        self._lanes = _check_lanes(lanes)
        self._client = client if client is not None else sync_client(url)
        self._x = SyncExecutor(self._client, retry_for=0)
        self._fixed = list(queues) if queues else None
        self._discover_s = discover_s
        self._found: list[str] = []
        self._found_at = -1e18
        self._lock = threading.Lock()

    def _names(self) -> list[str]:
        if self._fixed is not None:
            return self._fixed
        now = time.monotonic()
        if now - self._found_at >= self._discover_s:
            self._found = _inspect.discover(self._client)
            self._found_at = now
        return self._found

    def views(self) -> list[_inspect.QueueView]:
        with self._lock:
            return _sharded.snapshot(self._x, self._names(), minutes=2)

    def describe(self) -> Iterable[Metric]:
        # Metric names only: registering must not need the server.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            views = _sharded.snapshot(self._x, self._names(), minutes=2)
            found = _backlog.of_views(self._x, views)
        yield from families(views, lanes=self._lanes)
        yield from backlog_families(found)


DEFAULT_LANES = 50
OTHER_LANE = "~other"


def _check_lanes(lanes: int | None) -> int:
    if lanes is None:
        return DEFAULT_LANES
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 0:
        raise ValueError(f"lanes must be an int >= 0, got {lanes!r}")
    return lanes


def families(views: Iterable[_inspect.QueueView], *, lanes: int | None = None) -> Iterator[Metric]:
    """The metric families of queue snapshots (exposed for the dashboard's ``/metrics``):
    the ``lanes`` deepest lanes of each queue by name, the rest as ``lane="~other"``."""
    top = _check_lanes(lanes)
    jobs = GaugeMetricFamily("echomq_jobs", "Jobs per queue and state.", labels=["queue", "state"])
    paused = GaugeMetricFamily(
        "echomq_queue_paused", "1 when the queue is paused.", labels=["queue"]
    )
    done = CounterMetricFamily(
        "echomq_completed", "Jobs completed (server-side total).", labels=["queue"]
    )
    failed = CounterMetricFamily(
        "echomq_failed", "Jobs dead-lettered (server-side total).", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "echomq_oldest_waiting_age_seconds",
        "Age of the oldest waiting job (server now minus its id's mint time).",
        labels=["queue"],
    )
    lease = GaugeMetricFamily(
        "echomq_lease_headroom_seconds",
        "Seconds until the earliest lease deadline; negative: a lapsed lease awaits reap.",
        labels=["queue"],
    )
    rate = GaugeMetricFamily(
        "echomq_last_minute",
        "Settles in the last full minute (server-side per-minute series, D16).",
        labels=["queue", "kind"],
    )
    lane_depth = GaugeMetricFamily(
        "echomq_lane_depth", "Jobs waiting in a lane.", labels=["queue", "lane"]
    )
    lane_active = GaugeMetricFamily(
        "echomq_lane_active", "Jobs of a lane in flight.", labels=["queue", "lane"]
    )
    lane_limit = GaugeMetricFamily(
        "echomq_lane_limit", "A lane's concurrency cap (absent: none).", labels=["queue", "lane"]
    )
    lane_weight = GaugeMetricFamily(
        "echomq_lane_weight", "A lane's fair-share weight.", labels=["queue", "lane"]
    )
    lane_paused = GaugeMetricFamily(
        "echomq_lane_paused", "1 when the lane is paused.", labels=["queue", "lane"]
    )
    shard_jobs = GaugeMetricFamily(
        "echomq_shard_jobs",
        "Jobs per shard of a sharded queue and state (the queue's series are their sums).",
        labels=["queue", "shard", "state"],
    )
    for v in views:
        for state in ("pending", "active", "schedule", "dead"):
            jobs.add_metric([v.name, state], v.counts.get(state, 0))
            for shard in v.shards:  # a sharded queue (echomq.ops.sharded): the breakdown
                shard_jobs.add_metric([v.name, shard.name, state], shard.counts.get(state, 0))
        paused.add_metric([v.name], 1 if v.paused else 0)
        done.add_metric([v.name], v.counts.get("completed", 0))
        failed.add_metric([v.name], v.counts.get("failed", 0))
        age = v.oldest_waiting_age_s
        if age is not None:
            oldest.add_metric([v.name], age)
        headroom = v.lease_headroom_s
        if headroom is not None:
            lease.add_metric([v.name], headroom)
        if len(v.completed) > 1:
            rate.add_metric([v.name, "completed"], v.completed[1])
            rate.add_metric([v.name, "failed"], v.failed[1])
        ranked = sorted(v.lanes, key=lambda lane: (-lane.depth, -lane.active, lane.name))
        for lane in ranked[:top]:
            labels = [v.name, lane.name]
            lane_depth.add_metric(labels, lane.depth)
            lane_active.add_metric(labels, lane.active)
            if lane.limit is not None:
                lane_limit.add_metric(labels, lane.limit)
            lane_weight.add_metric(labels, lane.weight)
            lane_paused.add_metric(labels, 1 if lane.paused else 0)
        rest = ranked[top:]
        if rest:  # their sums only: a limit, weight or pause is per lane
            lane_depth.add_metric([v.name, OTHER_LANE], sum(lane.depth for lane in rest))
            lane_active.add_metric([v.name, OTHER_LANE], sum(lane.active for lane in rest))
    yield from (jobs, paused, done, failed, oldest, lease, rate)
    yield from (lane_depth, lane_active, lane_limit, lane_weight, lane_paused, shard_jobs)


def backlog_families(found: Iterable[_backlog.Backlog]) -> Iterator[Metric]:
    """The autoscaling signal (``echomq.ops.backlog``), one series per queue: what KEDA's
    prometheus scaler or an HPA on an external metric reads."""
    backlog = GaugeMetricFamily(
        "echomq_backlog",
        "Work a new worker could take now: waiting plus due delayed jobs (0 while paused).",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "echomq_backlog_oldest_wait_seconds",
        "How long the oldest job of the backlog has waited (0 with no backlog).",
        labels=["queue"],
    )
    for b in found:
        backlog.add_metric([b.queue], b.backlog)
        oldest.add_metric([b.queue], b.oldest_wait_s or 0.0)
    yield from (backlog, oldest)


class _WorkerMetrics:
    """The worker-side series, created once per registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.time_in_queue = Histogram(
            "echomq_job_time_in_queue_seconds",
            "Claim time minus the job id's mint time.",
            ["queue", "task"],
            buckets=TIME_BUCKETS,
            registry=reg,
        )
        self.run_time = Histogram(
            "echomq_job_run_seconds",
            "Handler run time per task.",
            ["queue", "task"],
            buckets=TIME_BUCKETS,
            registry=reg,
        )
        self.outcomes = Counter(
            "echomq_jobs_finished",
            "Handler runs by outcome (completed, retried, dead, lost).",
            ["queue", "task", "outcome"],
            registry=reg,
        )
        self.retries = Counter(
            "echomq_job_retries", "Runs the worker asked to retry.", ["queue", "task"], registry=reg
        )
        self.leases_lost = Counter(
            "echomq_worker_leases_lost",
            "Leases lost: an extend or settle refused for a stale token, or a job re-claimed.",
            registry=reg,
        )
        self.stale_refusals = Counter(
            "echomq_worker_stale_refusals",
            "Settles refused by the fence (StaleToken/JobGone) as reported by the worker.",
            registry=reg,
        )
        self.reaps = Counter(
            "echomq_worker_reaped",
            "Lapsed leases this worker's sweeps returned to pending.",
            registry=reg,
        )
        self.stall_deaths = Counter(
            "echomq_worker_stall_deaths",
            "Stalled jobs this worker's sweeps dead-lettered.",
            registry=reg,
        )
        self.stranded = Gauge(
            "echomq_worker_stranded_threads",
            "Sync handler threads still running past their run's end (a timeout, a hand-back).",
            registry=reg,
        )


_BY_REGISTRY: dict[int, _WorkerMetrics] = {}
_BY_REGISTRY_LOCK = threading.Lock()


def _worker_metrics(registry: CollectorRegistry | None) -> _WorkerMetrics:
    key = id(registry if registry is not None else REGISTRY)
    with _BY_REGISTRY_LOCK:
        found = _BY_REGISTRY.get(key)
        if found is None:
            found = _BY_REGISTRY[key] = _WorkerMetrics(registry)
        return found


class PrometheusHooks:
    """Worker hooks that record the worker-side series.

    ``Worker(app, hooks=PrometheusHooks().hooks())``, or pass its bound methods to your own
    :class:`~echomq.hooks.Hooks`. Every method is cheap (a dict write and a counter bump), so
    the worker's hot path gains no network call. The worker's own counters (leases lost,
    reaps, stall deaths) are read from ``worker.stats`` after each job and at shutdown.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.m = _worker_metrics(registry)
        self._clock = clock
        self._started: dict[tuple[str, str, int], float] = {}
        self._worker: Any = None
        self._seen = {"lost": 0, "recovered": 0, "swept_dead": 0, "stale_refused": 0}

    def hooks(self) -> Hooks:
        return Hooks(
            on_startup=self.on_startup,
            on_shutdown=self.on_shutdown,
            before_job=self.before_job,
            after_job=self.after_job,
        )

    def on_startup(self, worker: Any) -> None:
        self._worker = worker
        # A gauge read at each scrape: a stranded thread returns between jobs too.
        stats = getattr(worker, "stats", None)
        self.m.stranded.set_function(lambda: float(getattr(stats, "stranded_threads", 0)))

    def on_shutdown(self, worker: Any) -> None:
        self._worker = worker
        self._sync_stats()

    def before_job(self, job: Any) -> None:
        now = self._clock()
        try:
            minted = ids.decode_time_ms(job.id) / 1000
        except ValueError:
            minted = None
        if minted is not None:
            # The mint clock is the producer's: a skewed producer could make this negative.
            queue = logical_of(job.queue)  # a shard's run: its logical queue (issue 43)
            self.m.time_in_queue.labels(queue, job.task).observe(max(0.0, now - minted))
        self._started[(job.queue, job.id, job.token)] = now

    def after_job(self, job: Any, outcome: str, error: BaseException | None = None) -> None:
        start = self._started.pop((job.queue, job.id, job.token), None)
        queue = logical_of(job.queue)
        if start is not None:
            self.m.run_time.labels(queue, job.task).observe(max(0.0, self._clock() - start))
        self.m.outcomes.labels(queue, job.task, outcome).inc()
        if outcome == "retried":
            self.m.retries.labels(queue, job.task).inc()
        self._sync_stats()

    def stale_refused(self, n: int = 1) -> None:
        """For the worker to call where a settle comes back StaleToken/JobGone."""
        self.m.stale_refusals.inc(n)

    def _sync_stats(self) -> None:
        stats = getattr(self._worker, "stats", None)
        if stats is None:
            return
        for name, counter in (
            ("lost", self.m.leases_lost),
            ("recovered", self.m.reaps),
            ("swept_dead", self.m.stall_deaths),
            ("stale_refused", self.m.stale_refusals),
        ):
            value = int(getattr(stats, name, 0))
            delta = value - self._seen[name]
            if delta > 0:
                counter.inc(delta)
                self._seen[name] = value


def registry_for(
    url: str | None = None,
    *,
    client: Any = None,
    queues: Sequence[str] | None = None,
    worker_metrics: bool = True,
    server_metrics: bool = True,
    lanes: int | None = None,
) -> CollectorRegistry:
    """A registry holding, when ``server_metrics``, the queue collector (server-wide gauges:
    export them from one place, not from every worker) and, when ``worker_metrics``, this
    process's worker series, or every process's in multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR``). ``lanes``: see :class:`QueueCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    if server_metrics:
        registry.register(QueueCollector(url, client=client, queues=queues, lanes=lanes))
    if worker_metrics:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:
            _worker_metrics(None)  # make sure the series exist (zero) in this process
            registry.register(_Default())
    return registry


class _Default(Collector):
    """Forwards the default registry's worker series (in one process)."""

    def collect(self) -> Iterator[Metric]:
        wanted = ("echomq_job_", "echomq_jobs_finished", "echomq_worker_")
        for metric in REGISTRY.collect():
            if metric.name.startswith(wanted):
                yield metric


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition format of ``registry``."""
    return generate_latest(registry)


def metrics_app(
    url: str | None = None, *, client: Any = None, queues: Sequence[str] | None = None
) -> Any:
    """An ASGI app answering the exposition; mount it at ``/metrics`` in Starlette/FastAPI."""
    from prometheus_client import make_asgi_app

    return make_asgi_app(registry_for(url, client=client, queues=queues))


def serve(
    url: str | None = None,
    *,
    port: int = 9808,
    addr: str = "0.0.0.0",
    queues: Sequence[str] | None = None,
    lanes: int | None = None,
) -> None:
    """Serve ``/metrics`` on ``addr:port`` until interrupted (``echomq metrics``)."""
    from prometheus_client import start_http_server

    registry = registry_for(url, queues=queues, lanes=lanes)
    server, thread = start_http_server(port, addr=addr, registry=registry)
    try:
        while thread.is_alive():
            thread.join(1.0)
    finally:
        server.shutdown()
