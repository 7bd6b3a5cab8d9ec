"""The worker's Prometheus wiring: ``echomq worker --metrics-port`` serves the exposition with
the worker's own series (through PrometheusHooks), and a settle the fence refuses is counted
as a stale refusal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import echomq
from conftest import wait_for
from echomq import prometheus
from echomq.errors import JobGone, StaleToken
from echomq.prometheus import PrometheusHooks
from echomq.runtime.queueloop import WorkerStats
from echomq.runtime.runner import Settle

TESTS = Path(__file__).resolve().parents[1]


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_refused_settles_are_counted_as_stale_refusals() -> None:
    stats = WorkerStats()
    s = Settle("JOB0KHTOWnGLuC", 1, "completed")
    stats.count(s, StaleToken("EMQSTALE complete token mismatch"))
    stats.count(s, JobGone("JOB0KHTOWnGLuC"))
    stats.count(s, None)  # accepted: not a refusal
    assert (stats.stale_refused, stats.lost, stats.completed) == (2, 2, 1)

    registry = CollectorRegistry()
    hooks = PrometheusHooks(registry)

    class W:
        pass

    w = W()
    w.stats = stats  # type: ignore[attr-defined]
    hooks.on_startup(w)
    hooks.on_shutdown(w)
    hooks.on_shutdown(w)  # synced twice: counted once
    s_ = _samples(prometheus.exposition(registry).decode())
    assert s_[("echomq_worker_stale_refusals_total", frozenset())] == 2


def test_worker_metrics_port_serves_the_workers_series(url: str, qname: str) -> None:
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, EMQ_TEST_QUEUE=qname, PYTHONPATH=str(TESTS))
    cmd = [
        sys.executable, "-m", "echomq", "--url", url, "worker", "apps.basic:app",
        "-q", qname, "-c", "2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=TESTS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    q = echomq.Queue(qname, url=url)
    try:
        app = echomq.App(url)
        count = app.task(queue=qname, name="count")(lambda n: n)
        for i in range(3):
            count.enqueue(i)

        def scrape() -> Any:
            try:
                res = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except httpx.HTTPError:
                return None
            if res.status_code != 200:
                return None
            s = _samples(res.text)
            key = (
                "echomq_jobs_finished_total",
                frozenset({"queue": qname, "task": "count", "outcome": "completed"}.items()),
            )
            return s if s.get(key) == 3 else None

        s = wait_for(scrape, 60, 0.2)
        # The queue gauges of the worker's own queue are there too (read at scrape time).
        assert s[("echomq_jobs", frozenset({"queue": qname, "state": "pending"}.items()))] == 0
        app.close()
    finally:
        proc.terminate()
        proc.wait(60)
        q.close()
