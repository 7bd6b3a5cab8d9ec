"""The autoscaling signal (issue 40): ``echomq backlog --json``, the ``echomq_backlog*``
Prometheus gauges and the dashboard's ``/api/queues/<q>/backlog`` against known counts —
waiting (flat and lanes), delayed jobs due and not yet due, jobs in flight, a paused queue
— on both executors; and its bad input."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import echomq
from conftest import server_ms, wait_for
from echomq import prometheus
from echomq.cli import main
from echomq.web import create_app

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient; httpx works the same here.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

pytestmark = pytest.mark.executors


def backlog_cli(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--url", url, "backlog", *args])
    return result.exit_code, result.stdout, result.stderr or repr(result.exception)


def json_lines(url: str, *queues: str) -> list[dict[str, Any]]:
    code, out, err = backlog_cli(url, *queues, "--json")
    assert code == 0, (out, err)
    return [json.loads(line) for line in out.splitlines()]


def gauges(url: str, queue: str) -> dict[str, float]:
    text = prometheus.exposition(prometheus.registry_for(url, queues=[queue])).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("echomq_backlog") and s.labels == {"queue": queue}:
                out[s.name] = s.value
    return out


def known_counts(q: echomq.Queue, r: redis.Redis) -> int:
    """4 waiting (2 flat, 2 in a lane), 2 in flight, 3 delayed an hour, 2 delayed and due
    (no worker runs: nothing promotes them). The server time before the first enqueue."""
    began = server_ms(r)
    for payload in (b"a", b"b", b"c", b"d"):
        q.enqueue(payload)
    for payload in (b"e", b"f"):
        q.enqueue(payload, group="tenant")
    assert len(q.claim_batch(2)) == 2  # the two oldest flat jobs
    for _ in range(3):
        q.enqueue(b"later", delay_ms=3_600_000)
    due_at = server_ms(r) + 1
    for _ in range(2):
        q.enqueue(b"soon", delay_ms=1)
    wait_for(lambda: server_ms(r) > due_at + 1, 30)  # their time has come (server clock)
    return began


def test_the_cli_json_counts_the_work_a_new_worker_could_take(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    began = known_counts(q, r)
    (got,) = json_lines(url, q.name)
    age = got.pop("oldest_wait_s")
    assert got == {
        "queue": q.name,
        "backlog": 6,
        "waiting": 4,
        "due": 2,
        "scheduled": 5,
        "active": 2,
        "paused": False,
    }
    # The oldest waiting job ("c") was minted after `began`: its wait is at most the time since.
    assert 0 <= age <= (server_ms(r) - began) / 1000 + 0.01

    q.pause()  # nothing a worker could take: scaling out would not help
    (paused,) = json_lines(url, q.name)
    assert (paused["backlog"], paused["waiting"], paused["paused"]) == (0, 4, True)


def test_the_gauges_and_the_dashboard_agree_with_the_cli(
    url: str, q: echomq.Queue, r: redis.Redis
) -> None:
    known_counts(q, r)
    g = gauges(url, q.name)
    assert g["echomq_backlog"] == 6
    assert g["echomq_backlog_oldest_wait_seconds"] > 0
    with TestClient(create_app(url, queues=[q.name])) as c:
        resp = c.get(f"/api/queues/{q.name}/backlog")
        assert resp.status_code == 200
        body = resp.json()
        assert (body["backlog"], body["waiting"], body["due"]) == (6, 4, 2)
        assert c.get("/api/queues/no-such-queue/backlog").status_code == 404
        text = c.get("/metrics").text
        assert f'echomq_backlog{{queue="{q.name}"}} 6.0' in text, text


def test_an_empty_queue_and_several_queues(url: str, q: echomq.Queue, r: redis.Redis) -> None:
    with echomq.Queue(q.name + "-other", url=url) as other:
        other.enqueue(b"x")
        q.enqueue(b"later", delay_ms=3_600_000)  # exists, but nothing is due
        first, second = json_lines(url, q.name, other.name)
        assert (first["queue"], first["backlog"], first["oldest_wait_s"]) == (q.name, 0, None)
        assert (second["queue"], second["backlog"]) == (other.name, 1)
        assert gauges(url, q.name)["echomq_backlog_oldest_wait_seconds"] == 0
        code, out, _ = backlog_cli(url, q.name)  # the line for people
        assert code == 0 and out.startswith(f"{q.name}  backlog 0  oldest -"), out
        r.delete(*r.keys(f"emq:{{{other.name}}}:*"))


def test_bad_input_is_one_line_and_writes_nothing(url: str, r: redis.Redis) -> None:
    before = r.dbsize()
    code, _, err = backlog_cli(url, "no-such-queue-here", "--json")
    assert code == 1 and "does not exist" in err, err
    code, _, err = backlog_cli(url, "bad name{")
    assert code == 2 and err.startswith("error: "), err
    code, _, err = backlog_cli(url)
    assert code == 2 and "Missing argument" in err, err
    assert r.dbsize() == before
