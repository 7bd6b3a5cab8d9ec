"""Prometheus: the exposition parses with prometheus_client's own parser, and its figures equal
what a scripted run did (queue gauges read from the server, worker series from the hooks of a
real worker)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import echomq
from conftest import wait_for
from echomq import prometheus
from echomq.prometheus import PrometheusHooks


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_queue_gauges_equal_a_scripted_run(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    for _ in range(4):
        q.enqueue(b"x")
    for _ in range(3):
        q.enqueue(b"y", group="tenant-a")
    q.enqueue(b"z", group="tenant-b")
    q.enqueue(b"later", delay_ms=600_000)
    q.pause_lane("tenant-b")
    q.limit_lane("tenant-a", 2)
    q.weight_lane("tenant-a", 3)
    jobs = q.claim_batch(3)
    assert len(jobs) == 3
    q.complete(jobs[0].id, jobs[0].token)
    assert q.retry(jobs[1].id, jobs[1].token, delay_ms=0, max_attempts=1, error="e") == "dead"
    c = q.counts()
    active_a = sum(1 for j in jobs[2:] if j.group == "tenant-a")

    text = prometheus.exposition(prometheus.registry_for(url, queues=[q.name])).decode()
    s = _samples(text)
    for state in ("pending", "active", "schedule", "dead"):
        assert _get(s, "echomq_jobs", queue=q.name, state=state) == c[state]
    assert (c["active"], c["dead"], c["schedule"]) == (1, 1, 1)
    assert _get(s, "echomq_completed_total", queue=q.name) == 1
    assert _get(s, "echomq_failed_total", queue=q.name) == 1
    assert _get(s, "echomq_queue_paused", queue=q.name) == 0
    assert _get(s, "echomq_lane_limit", queue=q.name, lane="tenant-a") == 2
    assert _get(s, "echomq_lane_weight", queue=q.name, lane="tenant-a") == 3
    assert _get(s, "echomq_lane_paused", queue=q.name, lane="tenant-b") == 1
    assert _get(s, "echomq_lane_paused", queue=q.name, lane="tenant-a") == 0
    assert _get(s, "echomq_lane_depth", queue=q.name, lane="tenant-b") == 1
    assert _get(s, "echomq_lane_active", queue=q.name, lane="tenant-a") == active_a
    assert ("echomq_lane_limit", frozenset({("queue", q.name), ("lane", "tenant-b")})) not in s
    # The oldest waiting job was minted in this test: its age is small and not negative.
    assert 0 <= _get(s, "echomq_oldest_waiting_age_seconds", queue=q.name) < 60
    # One lease is held (30 s by default): its deadline lies ahead.
    assert 0 < _get(s, "echomq_lease_headroom_seconds", queue=q.name) <= 30

    q.pause()
    s = _samples(prometheus.exposition(prometheus.registry_for(url, queues=[q.name])).decode())
    assert _get(s, "echomq_queue_paused", queue=q.name) == 1


def test_a_lapsed_lease_shows_negative_headroom(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"x")
    assert q.claim(lease_ms=1) is not None
    time.sleep(0.05)  # the 1 ms lease has lapsed; nothing reaps it here
    s = _samples(prometheus.exposition(prometheus.registry_for(url, queues=[q.name])).decode())
    assert _get(s, "echomq_lease_headroom_seconds", queue=q.name) < 0


def test_worker_series_equal_a_real_run(url: str, qname: str) -> None:
    registry = CollectorRegistry()
    hooks = PrometheusHooks(registry)
    app = echomq.App(url=url)

    @app.task(queue=qname, name="ok")
    def ok(n: int) -> int:
        return n

    @app.task(queue=qname, name="bad", max_attempts=1)
    def bad() -> None:
        raise ValueError("no")

    for i in range(5):
        ok.enqueue(i)
    for _ in range(2):
        bad.enqueue()
    q = app.queue(qname)
    worker = echomq.Worker(app, [qname], 4, beat_ms=100, hooks=hooks.hooks())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    thread.start()
    try:
        wait_for(lambda: q.counts()["completed"] == 5 and q.counts()["dead"] == 2, 60)
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(60)
        loop.close()
        app.close()

    s = _samples(prometheus.exposition(registry).decode())
    labels = {"queue": qname, "task": "ok"}
    assert _get(s, "echomq_jobs_finished_total", outcome="completed", **labels) == 5
    assert _get(s, "echomq_job_run_seconds_count", **labels) == 5
    assert _get(s, "echomq_job_time_in_queue_seconds_count", **labels) == 5
    bad_labels = {"queue": qname, "task": "bad"}
    bad_runs = sum(
        v
        for (name, lbl), v in s.items()
        if name == "echomq_jobs_finished_total" and dict(lbl).get("task") == "bad"
    )
    assert bad_runs == 2
    assert _get(s, "echomq_job_time_in_queue_seconds_count", **bad_labels) == 2
    assert _get(s, "echomq_worker_leases_lost_total") == 0


def test_hooks_follow_the_workers_own_counters() -> None:
    registry = CollectorRegistry()
    hooks = PrometheusHooks(registry, clock=lambda: 0.0)

    class Stats:
        lost = 2
        recovered = 3
        swept_dead = 1

    class W:
        stats = Stats()

    hooks.on_startup(W())
    hooks.on_shutdown(W())
    hooks.stale_refused(4)
    s = _samples(prometheus.exposition(registry).decode())
    assert _get(s, "echomq_worker_leases_lost_total") == 2
    assert _get(s, "echomq_worker_reaped_total") == 3
    assert _get(s, "echomq_worker_stall_deaths_total") == 1
    assert _get(s, "echomq_worker_stale_refusals_total") == 4
    Stats.lost = 5
    hooks.on_shutdown(W())
    s = _samples(prometheus.exposition(registry).decode())
    assert _get(s, "echomq_worker_leases_lost_total") == 5


def test_multiprocess_mode(url: str, q: echomq.Queue, tmp_path: Any, monkeypatch: Any) -> None:
    """With PROMETHEUS_MULTIPROC_DIR the served registry aggregates the files of every
    process (here: values written by this one) next to the queue gauges."""
    import subprocess
    import sys

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    code = (
        "from prometheus_client import CollectorRegistry\n"
        "from echomq.prometheus import PrometheusHooks\n"
        "h = PrometheusHooks()\n"
        "h.stale_refused(3)\n"
    )
    for _ in range(2):  # two worker processes
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    q.enqueue(b"x")
    s = _samples(prometheus.exposition(prometheus.registry_for(url, queues=[q.name])).decode())
    assert _get(s, "echomq_worker_stale_refusals_total") == 6
    assert _get(s, "echomq_jobs", queue=q.name, state="pending") == 1


def test_server_side_series_feed_the_last_minute_gauge(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    minute = int(r.time()[0]) // 60
    r.rpush(f"emq:{{{q.name}}}:metrics:completed:data", f"{minute}:2", f"{minute - 1}:7")
    r.rpush(f"emq:{{{q.name}}}:metrics:failed:data", f"{minute - 1}:3")
    s = _samples(prometheus.exposition(prometheus.registry_for(url, queues=[q.name])).decode())
    if int(r.time()[0]) // 60 != minute:
        return  # the minute turned while reading: the figures moved by design
    assert _get(s, "echomq_last_minute", queue=q.name, kind="completed") == 7
    assert _get(s, "echomq_last_minute", queue=q.name, kind="failed") == 3


def test_metrics_app_mounts_in_a_user_app(url: str, q: echomq.Queue) -> None:
    import warnings

    from starlette.applications import Starlette
    from starlette.routing import Mount

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    q.enqueue(b"x")
    app = Starlette(routes=[Mount("/metrics", app=prometheus.metrics_app(url, queues=[q.name]))])
    with TestClient(app) as c:
        res = c.get("/metrics/")
    assert res.status_code == 200
    assert _get(_samples(res.text), "echomq_jobs", queue=q.name, state="pending") == 1


def test_echomq_metrics_command_serves_the_exposition(url: str, q: echomq.Queue) -> None:
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    q.enqueue(b"x")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "echomq",
            "--url",
            url,
            "metrics",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-q",
            q.name,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def scrape() -> str | None:
            try:
                res = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except httpx.HTTPError:
                return None
            return res.text if res.status_code == 200 else None

        text = wait_for(scrape, 30, 0.2)
    finally:
        proc.terminate()
        proc.wait(60)
    assert _get(_samples(text), "echomq_jobs", queue=q.name, state="pending") == 1
