"""Operating a sharded queue (issue 43): ``echomq reshard`` grows it (a shrink is refused with
the procedure), and the operator views — ``stats``, ``check``, ``browse``, the snapshots and
backlog, the Prometheus collector, the dashboard — show it once under its logical name with
its shards' sums, and its shards as a breakdown. Shards are ordinary queues: the tests put
jobs on them directly."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

import echomq
from echomq import prometheus
from echomq.cli import main
from echomq.client.executor import SyncExecutor, sync_client
from echomq.client.shards import grow, layout
from echomq.ops import backlog as _backlog
from echomq.ops import sharded as _sharded
from echomq.prometheus import PrometheusHooks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from echomq.web import create_app


@pytest.fixture
def cli(url: str) -> Any:
    runner = CliRunner(env={"COLUMNS": "400", "ECHOMQ_URL": None})

    def run(*args: str) -> Result:
        return runner.invoke(main, ["--url", url, *args])

    return run


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result.stdout


@pytest.fixture
def sharded(url: str, q: echomq.Queue) -> Iterator[list[echomq.Queue]]:
    """``q`` with 3 shards: 2 pending jobs on shard 0, 3 on shard 1, 4 on shard 2, one of
    shard 2's claimed and one of shard 1's dead; shard 2 holds a lane ``a``."""
    names = q.propose_shards(layout(q.name, 3))
    queues = [q] + [echomq.Queue(n, url=url) for n in names[1:]]
    for i, shard in enumerate(queues):
        for n in range(2 + i):
            shard.enqueue(f"{i}-{n}".encode(), group="a" if i == 2 and n == 0 else None)
    job = queues[1].claim()
    assert job is not None
    assert queues[1].retry(job.id, job.token, delay_ms=0, max_attempts=1, error="e") == "dead"
    assert queues[2].claim(lease_ms=60_000) is not None
    yield queues
    for shard in queues[1:]:
        shard.close()


def _x(url: str) -> SyncExecutor:
    return SyncExecutor(sync_client(url), retry_for=0)


# --------------------------------------------------------------------------- reshard


def test_reshard_grows_and_refuses_to_shrink(cli, q: echomq.Queue, qname: str) -> None:
    q.enqueue(b"x")
    out = ok(cli("reshard", qname, "3"))
    assert out.startswith(f"{qname}: 1 -> 3 shards")
    assert q.shards() == layout(qname, 3)
    for i, name in enumerate(layout(qname, 3)):
        assert f"  {i} {name} (slot " in out
    assert "has 3 shards already" in ok(cli("reshard", qname, "3"))
    assert q.shards() == layout(qname, 3)
    ok(cli("reshard", qname, "5"))
    assert q.shards() == grow(qname, layout(qname, 3), 5)
    shrink = cli("reshard", qname, "2")
    assert shrink.exit_code == 2
    assert "shrinking to 2 is refused" in shrink.output and "To shrink:" in shrink.output
    assert "obliterate it, and recreate it with shards=2" in shrink.output
    for bad in ("0", "257"):
        assert cli("reshard", qname, bad).exit_code == 2
    assert len(q.shards()) == 5  # nothing written by the refusals
    listed = ok(cli("shards", qname)).splitlines()
    assert [line.split()[1] for line in listed] == q.shards()


def test_reshard_of_an_unknown_queue(cli, q: echomq.Queue, qname: str) -> None:
    result = cli("reshard", qname, "3")
    assert result.exit_code == 1 and "does not exist" in result.output
    assert q.shards() == [qname]
    assert "1 -> 3 shards" in ok(cli("reshard", qname, "3", "--create"))
    assert q.shards() == layout(qname, 3)


# --------------------------------------------------------------------------- reads


def test_snapshot_folds_the_shards_into_their_sums(url: str, sharded, qname: str) -> None:
    names = [s.name for s in sharded]
    x = _x(url)
    # Discovery lists the shards too: they fold under the logical name, in any order.
    (view,) = _sharded.snapshot(x, [names[2], qname, names[1]], minutes=2)
    assert view.name == qname
    assert [s.name for s in view.shards] == names
    assert view.counts["pending"] == 2 + 2 + 3 == sum(s.counts["pending"] for s in view.shards)
    assert (view.counts["active"], view.counts["dead"], view.counts["failed"]) == (1, 1, 1)
    assert [lane.name for lane in view.lanes] == ["a"]
    assert view.oldest_waiting_ms == min(s.oldest_waiting_ms for s in view.shards)
    assert view.lease_deadline_ms == view.shards[2].lease_deadline_ms
    assert "shards" in view.as_dict() and "shards" not in view.shards[0].as_dict()
    (backlog,) = _backlog.of_views(x, [view])
    assert (backlog.queue, backlog.waiting, backlog.active) == (qname, 7, 1)
    # A shard named alone is its own queue; a plain queue is unchanged.
    (alone,) = _sharded.snapshot(x, [names[1]], minutes=0)
    assert (alone.name, alone.shards, alone.counts["pending"]) == (names[1], [], 2)
    for s in sharded:
        s.pause()
    assert _sharded.snapshot(x, [qname])[0].paused
    sharded[1].resume()
    assert not _sharded.snapshot(x, [qname])[0].paused  # paused only when every shard is


def test_cli_stats_check_browse_show_the_logical_queue(
    cli, sharded, qname: str, r: redis.Redis
) -> None:
    names = [s.name for s in sharded]
    rows = [line for line in ok(cli("stats", qname, names[1])).splitlines() if "│" in line]
    mine = [line for line in rows if names[1] in line or qname in line]
    assert len(mine) == 1, rows  # one row: the shard folded under its queue
    cells = [c.strip() for c in mine[0].split("│") if c.strip()]
    assert cells[:5] == [qname, "7", "1", "0", "1"], cells

    assert ok(cli("check", qname)).strip() == f"{qname}: ok"
    r.zadd(f"emq:{{{names[2]}}}:active", {"0000000000000-bogus": 1})
    bad = cli("check", qname)
    assert bad.exit_code == 1
    assert f"{qname}: {names[2]}: " in bad.output

    ids = ok(cli("browse", qname, "--ids", "-n", "50")).split()
    expected = {j for s in sharded for j in s.browse("pending", 50)}
    assert len(ids) == 7 and set(ids) == expected
    assert len(ok(cli("browse", qname, "--ids", "-n", "3")).split()) == 3
    # The ids of every shard take turns: each shard's newest are in the first three.
    firsts = ok(cli("browse", qname, "--ids", "-n", "3")).split()
    assert {s.name for s in sharded for j in firsts if j in s.browse("pending", 50)} == set(names)
    dead = ok(cli("browse", qname, "--state", "dead"))
    assert sharded[1].browse("dead", 5)[0] in dead


# --------------------------------------------------------------------------- metrics, web


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_prometheus_sums_a_sharded_queue_with_a_shard_breakdown(
    url: str, sharded, qname: str
) -> None:
    names = [s.name for s in sharded]
    reg = prometheus.registry_for(url, queues=[qname, *names[1:]])
    s = _samples(prometheus.exposition(reg).decode())
    queues = {dict(k[1]).get("queue") for k in s if k[0] == "echomq_jobs"}
    assert queues == {qname}  # the shards are not queues of their own here
    jobs = {st: s[("echomq_jobs", frozenset({("queue", qname), ("state", st)}))] for st in
            ("pending", "active", "dead")}  # fmt: skip
    assert jobs == {"pending": 7, "active": 1, "dead": 1}
    for shard, pending in zip(names, (2, 2, 3), strict=True):
        key = frozenset({("queue", qname), ("shard", shard), ("state", "pending")})
        assert s[("echomq_shard_jobs", key)] == pending
    assert s[("echomq_backlog", frozenset({("queue", qname)}))] == 7
    # A plain queue gets no shard series.
    plain = _samples(
        prometheus.exposition(prometheus.registry_for(url, queues=[names[1]])).decode()
    )
    assert not [k for k in plain if k[0] == "echomq_shard_jobs"]


def test_worker_metrics_label_a_shard_run_with_its_logical_queue(qname: str) -> None:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    hooks = PrometheusHooks(registry=reg)
    shard = layout(qname, 2)[1]

    class Ctx:
        queue, task, token, id = shard, "t", 1, "not-a-minted-id"

    hooks.before_job(Ctx())
    hooks.after_job(Ctx(), "completed")
    s = _samples(prometheus.exposition(reg).decode())
    labels = frozenset({("queue", qname), ("task", "t"), ("outcome", "completed")})
    assert s[("echomq_jobs_finished_total", labels)] == 1


def test_dashboard_groups_the_shards_under_their_queue(url: str, sharded, qname: str) -> None:
    names = [s.name for s in sharded]
    with TestClient(create_app(url, queues=[qname, *names[1:]])) as c:
        page = c.get("/").text
        assert page.count(f'data-queue="{qname}"') == 1
        assert page.count(f'data-shard-of="{qname}"') == 3
        assert "3 shards" in page
        assert f'data-queue="{names[1]}"' not in page
        api = c.get("/api/queues").json()["queues"]
        assert [v["name"] for v in api] == [qname]
        assert api[0]["counts"]["pending"] == 7
        assert [v["name"] for v in api[0]["shards"]] == names
        one = c.get(f"/queues/{qname}").text
        assert 'id="shards"' in one
        for n in names:
            assert f'data-shard="{n}"' in one
        assert 'id="shards"' not in c.get(f"/queues/{names[1]}").text


def test_cli_lanes_lists_every_shard_and_sets_a_lane_on_its_shard(
    cli, url: str, sharded, qname: str
) -> None:
    from echomq.client.shards import shard_of
    from echomq.ops import snapshots

    listed = ok(cli("lanes", qname))
    assert listed.splitlines()[1].split()[0] == "a"  # shard 2's lane, seen from the queue
    lane = "tenant-7"
    home = sharded[shard_of(lane, 3)].name
    shown = ok(cli("lanes", qname, lane, "--limit", "2", "--pause")).splitlines()
    assert shown[1].split() == [lane, "0", "0", "2", "1", "yes"]
    views = snapshots.snapshot(_x(url), [s.name for s in sharded], minutes=0)
    holders = {v.name: [(g.limit, g.paused) for g in v.lanes if g.name == lane] for v in views}
    assert holders == {s.name: [(2, True)] if s.name == home else [] for s in sharded}


def test_cli_writes_act_on_the_logical_queue(cli, sharded, qname: str) -> None:
    """An operator's write on a sharded queue acts on every shard (pause, resume, remove of a
    job on any shard), and a queue-wide limit is refused as the API refuses it: exit 2 with
    the rule, nothing written."""
    ok(cli("pause", qname))
    assert all(s.is_paused() for s in sharded)
    ok(cli("resume", qname))
    assert not any(s.is_paused() for s in sharded)
    far = sharded[2].browse("pending", 50)[-1]
    assert f"{far}: removed" in ok(cli("remove", qname, far))
    assert sharded[2].job_state(far) == "absent"
    refused = cli("limit", qname, "3")
    assert refused.exit_code != 0 and "shard" in refused.output.lower(), refused.output
    assert all(s.get_limit() is None for s in sharded)


def test_dashboard_actions_act_on_every_shard(url: str, sharded, qname: str) -> None:
    """The logical queue's page acts on the logical queue: pause and resume reach every
    shard, retry-all-dead finds the dead job on shard 1, a job's action finds its shard."""
    from console_support import _client
    from test_dashboard import TOKEN, _sign_in

    with _client(url, None, token=TOKEN) as c:
        csrf = _sign_in(c)
        for action, paused in (("pause", True), ("resume", False)):
            res = c.post(f"/queues/{qname}/{action}", data={"csrf": csrf}, follow_redirects=False)
            assert res.status_code == 303, res.text[:200]
            assert [s.is_paused() for s in sharded] == [paused] * 3
        assert sharded[1].counts()["dead"] == 1
        c.post(f"/queues/{qname}/retry_dead", data={"csrf": csrf}, follow_redirects=False)
        assert sharded[1].counts()["dead"] == 0
        far = sharded[2].browse("pending", 50)[-1]
        path = f"/queues/{qname}/jobs/{far}/cancel"
        done = c.post(path, data={"csrf": csrf, "confirm": "yes"}, follow_redirects=False)
        assert done.status_code == 303 and sharded[2].job_state(far) == "absent"
