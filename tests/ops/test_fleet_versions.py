"""Versions in the fleet (issue 39): every worker's echomq version, the data layouts it
serves and its executor are in its registry entry, shown by ``echomq workers`` (and
``--json``) and the dashboard's workers page, with a warning line when the live workers span
more than two consecutive releases. The entry stays readable both ways: a 0.5.0 writer's
entry (no layout) is listed, and 0.5.0's reader lists this release's entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from console_support import _client

import echomq
import releases
from echomq import ids
from echomq.cli import main
from echomq.client import layout as _layout
from echomq.protocol import registry as _registry
from echomq.protocol.kernel import Keys
from echomq.runtime import worker_registry as _worker_registry

pytestmark = pytest.mark.executors("lua", "native")

# Run by echomq 0.5.0: its own worker's registry entry for queue argv[2], one beat.
V05_BEAT = """
import sys, echomq
from echomq import _registry  # 0.5.0's own module path (move-rewrite: keep)
from echomq._kernel import Keys  # 0.5.0's own module path (move-rewrite: keep)
url, name = sys.argv[1], sys.argv[2]
q = echomq.Queue(name, url=url)
reg = _registry.Registry([name], 2, 60_000)
q._x.run(_registry.beat(Keys(name), reg.id, reg.entry([], "lua"), 600_000))
print(reg.id)
"""

# Run by echomq 0.5.0: the ids and versions its reader lists.
V05_READ = """
import sys, echomq
q = echomq.Queue(sys.argv[2], url=sys.argv[1])
for w in q.workers():
    print(w.id, w.version)
"""


@pytest.fixture(scope="module")
def v05(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return releases.build("v0.5.0", tmp_path_factory.mktemp("v0.5.0"))


def beat_as(q: echomq.Queue, version: str) -> str:
    """One beat of this release's registry, claiming ``version`` (a fleet mid-upgrade)."""
    reg = _worker_registry.Registry([q.name], 4, 60_000)
    reg._static["version"] = version
    q._x.run(_registry.beat(Keys(q.name), reg.id, reg.entry([], q.executor), 600_000))
    return reg.id


def workers_cli(url: str, *args: str) -> tuple[str, str]:
    result = CliRunner(env={"ECHOMQ_URL": None}).invoke(main, ["--url", url, "workers", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout, result.stderr


def test_echomq_workers_shows_each_workers_version_and_layouts(
    url: str, redis_url: str, q: echomq.Queue, v05: Path
) -> None:
    q.enqueue(b"x")  # fences: the executor is decided
    new = beat_as(q, "0.6.0")
    old = releases.run(v05, V05_BEAT, redis_url, q.name).strip()
    out, _ = workers_cli(url, q.name)
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("WRK")}
    serves = f"{_layout.MIN_LAYOUT}..{_layout.LAYOUT}"
    assert f" version=0.6.0 layout={serves} {q.executor} " in lines[new], out
    assert " version=0.5.0 layout=? lua " in lines[old], out  # 0.5 records no layout
    assert "warning" not in out  # 0.5 and 0.6: the contract's N-1 and N

    listed = json.loads(workers_cli(url, q.name, "--json")[0])
    by_id = {w["id"]: w for w in listed}
    assert by_id[new]["version"] == "0.6.0" and by_id[new]["layout"] == _layout.LAYOUT
    assert by_id[new]["min_layout"] == _layout.MIN_LAYOUT
    assert by_id[new]["executor"] == q.executor
    assert by_id[old]["version"] == "0.5.0" and by_id[old]["layout"] == 0


def test_a_fleet_beyond_two_releases_is_warned_about(url: str, q: echomq.Queue) -> None:
    q.enqueue(b"x")
    beat_as(q, "0.6.0")
    beat_as(q, "0.4.2")
    out, _ = workers_cli(url, q.name)
    warning = out.splitlines()[-1]
    assert warning.startswith("warning: the fleet runs echomq 0.4.2, 0.6.0:"), out
    assert "docs/guides/upgrading.md" in warning
    listed, err = workers_cli(url, q.name, "--json")
    assert len(json.loads(listed)) == 2  # stdout stays one JSON document
    assert err.startswith("warning: the fleet runs echomq 0.4.2, 0.6.0")

    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}/workers").text
        assert 'id="version-spread"' in page and "0.4.2, 0.6.0" in page
        assert '<td class="mono version">0.4.2</td>' in page
        api = c.get(f"/api/queues/{q.name}/workers").json()
        assert api["warning"].startswith("warning: the fleet runs echomq 0.4.2, 0.6.0")
        assert sorted(w["version"] for w in api["workers"]) == ["0.4.2", "0.6.0"]


def test_the_dashboard_shows_versions_without_a_warning_for_n_1_and_n(
    url: str, q: echomq.Queue
) -> None:
    q.enqueue(b"x")
    beat_as(q, "0.5.3")
    beat_as(q, "0.6.0")
    with _client(url, [q.name]) as c:
        page = c.get(f"/queues/{q.name}/workers").text
        assert 'id="version-spread"' not in page
        assert '<td class="mono version">0.5.3</td>' in page
        assert f'<td class="mono layout">{_layout.MIN_LAYOUT}..{_layout.LAYOUT}</td>' in page


def test_the_previous_release_reads_this_releases_entries(
    redis_url: str, q: echomq.Queue, v05: Path
) -> None:
    q.enqueue(b"x")
    new = beat_as(q, "0.6.0")
    listed = releases.run(v05, V05_READ, redis_url, q.name).split()
    assert listed == [new, "0.6.0"]


def test_an_unreadable_entry_is_left_out(q: echomq.Queue, r: redis.Redis) -> None:
    q.enqueue(b"x")
    good = beat_as(q, "0.6.0")
    bad = ids.mint("WRK")
    r.hset(f"emq:{{{q.name}}}:workers", bad, json.dumps({"host": "h", "layout": "two"}))
    r.zadd(f"emq:{{{q.name}}}:workers:ttl", {bad: 2**50})
    assert [w.id for w in q.workers()] == [good]
