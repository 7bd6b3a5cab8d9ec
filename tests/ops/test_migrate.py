"""``echomq migrate`` on data written by the real echomq 0.3.0 (built from its tag, run in a
subprocess): the dead-letters it scored 0 are rescored, so the first age-bounded
``keep_dead`` keeps them; the run is idempotent, resumable (stopped after its first batch)
and safe beside a running worker of the previous release (0.5.0). Every test has a server
of its own: the migration's progress and the layout are deployment-wide."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import echomq
import releases
from conftest import wait_for
from echomq.cli import main
from echomq.client import executor as _executor
from echomq.client import layout as _layout
from echomq.ops import migrate as _migrate

LEGS = ["lua", "native"]
HOUR_MS = 3_600_000

# Run by echomq 0.3.0: `n` jobs on queue argv[2], each claimed and failed at its ceiling
# (dead-lettered with score 0), and one left pending.
V03_DEAD = """
import sys, echomq
url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = echomq.Queue(name, url=url)
for i in range(n):
    q.enqueue(b"job %d" % i)
    job = q.claim(lease_ms=60_000)
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
q.enqueue(b"left pending")
print(q.counts()["dead"])
"""

# Run by echomq 0.5.0 until argv[3] exists: a worker's transitions in a loop (enqueue,
# claim, then complete or fail at the ceiling), as a fleet of the previous release would.
V05_LOOP = """
import os, sys, echomq
url, name, stop = sys.argv[1], sys.argv[2], sys.argv[3]
q = echomq.Queue(name, url=url)
i = 0
while not os.path.exists(stop):
    q.enqueue(b"n-1 %d" % i)
    job = q.claim(lease_ms=60_000)
    if i % 2:
        q.complete(job.id, job.token)
    else:
        assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="x") == "dead"
    i += 1
    if i == 20:
        open(stop + ".running", "w").close()
print(i)
"""


@pytest.fixture(scope="module")
def v03(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return releases.build("v0.3.0", tmp_path_factory.mktemp("v0.3.0"))


@pytest.fixture(scope="module")
def v05(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return releases.build("v0.5.0", tmp_path_factory.mktemp("v0.5.0"))


@pytest.fixture(params=LEGS)
def own(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, redis.Redis]]:
    """A server of this test's own: its URL (echomq's, with the leg's executor) and a raw
    client. The releases get the URL without the executor option (0.3 knows none)."""
    with releases.own_server(request, request.param, tmp_path / "srv") as found:
        yield found


def plain(url: str) -> str:
    return url.split("?", 1)[0]


def cli(url: str, *args: str) -> str:
    result = CliRunner(env={"ECHOMQ_URL": None}).invoke(main, ["--url", url, "migrate", *args])
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result.stdout


def zeros(raw: redis.Redis, queue: str) -> int:
    return int(raw.zcount("emq:{" + queue + "}:dead", 0, 0))


def run(url: str, **kw: Any) -> list[_migrate.Progress]:
    client = _executor.sync_client(plain(url))
    try:
        x = _executor.SyncExecutor(client, retry_for=0, executor=url.split("executor=")[1])
        return _migrate.migrate(x, client, **kw)
    finally:
        client.close()


def trim_by_age(url: str, queue: str) -> int:
    """Bound ``dead`` by age (an hour) with this release and dead-letter one job, which
    trims; the dead-letters left."""
    q = echomq.Queue(queue, url=url)
    try:
        q.keep_dead(None, age_ms=HOUR_MS)
        q.enqueue(b"trigger")
        while (job := q.claim()) is not None and job.payload != b"trigger":
            q.complete(job.id, job.token)
        assert job is not None
        assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="now") == "dead"
        assert q.check() == []
        return q.counts()["dead"]
    finally:
        q.close()


def test_migrate_keeps_the_dead_letters_echomq_0_3_wrote(
    own: tuple[str, redis.Redis], v03: Path
) -> None:
    url, raw = own
    assert releases.run(v03, V03_DEAD, plain(url), "kept", "12").strip() == "12"
    assert releases.run(v03, V03_DEAD, plain(url), "control", "5").strip() == "5"
    assert zeros(raw, "kept") == 12 and zeros(raw, "control") == 5

    out = cli(url, "--queue", "kept")
    assert "kept: dead-scores: migrated 12 in 1 steps" in out
    assert zeros(raw, "kept") == 0 and zeros(raw, "control") == 5
    assert raw.get("{emq}:layout") is None  # one queue: the layout is not recorded yet

    # The first age-bounded trim keeps the migrated queue's dead-letters (+ the new one)...
    assert trim_by_age(url, "kept") == 13
    # ...and deletes the unmigrated ones at once: what the migration is for.
    assert trim_by_age(url, "control") == 1


def test_migrate_is_idempotent_and_records_the_layout(
    own: tuple[str, redis.Redis], v03: Path
) -> None:
    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "a", "7")
    releases.run(v03, V03_DEAD, plain(url), "b", "3")
    dry = cli(url, "--dry-run")
    assert "a: dead-scores: 7 to migrate" in dry and "b: dead-scores: 3 to migrate" in dry
    assert zeros(raw, "a") == 7 and raw.hgetall("{emq}:migrations") == {}  # nothing written

    first = cli(url)
    assert "a: dead-scores: migrated 7" in first and "b: dead-scores: migrated 3" in first
    assert f"data layout: {_layout.LAYOUT}" in first
    scores = raw.zrange("emq:{a}:dead", 0, -1, withscores=True)
    assert all(s > 0 for _, s in scores)

    second = cli(url)
    assert "a: dead-scores: already done" in second and "b: dead-scores: already done" in second
    assert raw.zrange("emq:{a}:dead", 0, -1, withscores=True) == scores  # nothing moved
    assert raw.get("{emq}:layout") == str(_layout.LAYOUT).encode()
    for name in ("a", "b"):
        assert raw.hget("{emq}:migrations", f"dead-scores:{name}").startswith(b"done:")
        q = echomq.Queue(name, url=url)
        try:
            assert q.check() == [] and q.counts()["pending"] == 1
        finally:
            q.close()


def test_migrate_resumes_where_it_stopped(own: tuple[str, redis.Redis], v03: Path) -> None:
    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "r", "10")
    stopped = run(url, batch=4, max_batches=1)
    assert [(p.queue, p.migrated, p.done) for p in stopped] == [("r", 4, False)]
    assert zeros(raw, "r") == 6
    assert raw.hget("{emq}:migrations", "dead-scores:r") == b"running:4"
    assert raw.get("{emq}:layout") is None  # a stopped run records no layout
    rest = run(url, batch=4)
    assert [(p.migrated, p.batches, p.left) for p in rest] == [(6, 2, 0)]
    assert zeros(raw, "r") == 0 and raw.zcard("emq:{r}:dead") == 10
    assert raw.hget("{emq}:migrations", "dead-scores:r").startswith(b"done:")
    assert raw.get("{emq}:layout") == str(_layout.LAYOUT).encode()


def test_migrate_beside_a_running_worker_of_the_previous_release(
    own: tuple[str, redis.Redis], v03: Path, v05: Path, tmp_path: Path
) -> None:
    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "live", "40")
    stop = tmp_path / "stop"
    worker = releases.start(v05, V05_LOOP, plain(url), "live", str(stop), log=tmp_path / "n-1.log")
    try:
        wait_for(lambda: (tmp_path / "stop.running").exists() or worker.poll() is not None)
        assert worker.poll() is None, (tmp_path / "n-1.log").read_text()
        done = run(url, batch=3)  # 14 atomic steps while the 0.5 loop dead-letters beside them
        assert done[0].migrated == 40 and done[0].left == 0
    finally:
        stop.touch()
        assert worker.wait(timeout=60) == 0, (tmp_path / "n-1.log").read_text()
    ran = int((tmp_path / "n-1.log").read_text().split()[-1])
    assert zeros(raw, "live") == 0
    # Every job of both releases is where it should be: 40 + the 0.5 loop's failures dead.
    assert raw.zcard("emq:{live}:dead") == 40 + (ran + 1) // 2
    q = echomq.Queue("live", url=url)
    try:
        assert q.check() == []
    finally:
        q.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--batch", "0"], "Invalid value for '--batch'"),
        (["--queue", "no{brace"], "error:"),
    ],
)
def test_migrate_refuses_bad_input_and_writes_nothing(
    own: tuple[str, redis.Redis], v03: Path, args: list[str], says: str
) -> None:
    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "bad", "2")
    result = CliRunner(env={"ECHOMQ_URL": None}).invoke(main, ["--url", url, "migrate", *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert zeros(raw, "bad") == 2 and raw.hgetall("{emq}:migrations") == {}


def test_a_dead_letter_moved_before_its_step_is_left_where_it_went(
    own: tuple[str, redis.Redis], v03: Path
) -> None:
    # Between two steps of a run, this release reprocesses one 0.3 dead-letter and removes
    # another: the step rescores only members still in `dead` (ZADD XX), so the reprocessed
    # job stays waiting, the removed one stays gone, and nothing is counted twice.
    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "moved", "6")
    first = run(url, batch=2, max_batches=1)
    assert first[0].migrated == 2
    left = [m.decode() for m in raw.zrangebyscore("emq:{moved}:dead", 0, 0)]
    q = echomq.Queue("moved", url=url)
    try:
        q.reprocess(left[0])
        q.remove(left[1])
        rest = run(url, batch=2)
        assert rest[0].migrated == 2 and rest[0].left == 0
        assert raw.zcard("emq:{moved}:dead") == 4 and zeros(raw, "moved") == 0
        assert raw.zscore("emq:{moved}:dead", left[0]) is None
        assert q.job_state(left[0]) == "pending" and raw.exists(f"emq:{{moved}}:job:{left[1]}") == 0
        assert q.check() == []
    finally:
        q.close()


def test_migrate_runs_under_the_least_privilege_acl(
    own: tuple[str, redis.Redis], v03: Path
) -> None:
    # RELIABILITY.md's ACL rule set is enough: no deployment changes its ACL to upgrade.
    from test_security import ACL_RULES

    url, raw = own
    releases.run(v03, V03_DEAD, plain(url), "acl", "3")
    raw.execute_command("ACL", "SETUSER", "emq", ">s3cret", *ACL_RULES)
    port = plain(url).rsplit(":", 1)[1].split("/")[0]
    user_url = f"redis://emq:s3cret@127.0.0.1:{port}/0?" + url.split("?", 1)[1]
    assert "acl: dead-scores: 3 to migrate" in cli(user_url, "--dry-run")
    assert "acl: dead-scores: migrated 3 in 1 steps" in cli(user_url)
    assert zeros(raw, "acl") == 0 and raw.get("{emq}:layout") == str(_layout.LAYOUT).encode()
    denied = {(e["reason"], e["object"]) for e in raw.acl_log()}
    assert denied <= {("command", "config|get")}, denied  # the eviction check, skipped
