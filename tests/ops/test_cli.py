"""The ``echomq`` command line: producing (``enqueue``), operating (``stats``, ``browse``,
``job``, ``reprocess``, ``pause``/``resume``, ``sweep``, ``check``) and its errors, through
click's CliRunner and a few real ``python -m echomq`` processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import echomq
from conftest import wait_for
from echomq import ids
from echomq.cli import main
from echomq.server import free_port
from procs import TESTS_DIR


@pytest.fixture
def cli(url: str) -> Any:
    """Run ``echomq --url URL ARGS...`` in-process; a wide terminal so tables do not wrap."""
    runner = CliRunner(env={"COLUMNS": "400", "ECHOMQ_URL": None})

    def run(*args: str, input: bytes | str | None = None, use_env: bool = False) -> Result:
        if use_env:
            return runner.invoke(main, list(args), input=input, env={"ECHOMQ_URL": url})
        return runner.invoke(main, ["--url", url, *args], input=input)

    return run


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result.stdout


def receipt(result: Result) -> tuple[str, str]:
    job_id, status = ok(result).split()
    return job_id, status


def make_dead(q: echomq.Queue, payload: bytes = b"x") -> str:
    """A dead job (call it before enqueueing anything else claimable)."""
    e = q.enqueue(payload)
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.id == e.id
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    return e.id


# --------------------------------------------------------------------------- enqueue


def test_enqueue_raw_payload(cli, q: echomq.Queue, qname: str) -> None:
    job_id, status = receipt(cli("enqueue", qname, "hello world"))
    assert status == "enqueued" and ids.is_valid(job_id)
    assert q.get_job(job_id)["payload"] == b"hello world"
    assert q.job_state(job_id) == "pending"


def test_enqueue_reads_stdin_and_uses_the_env_url(cli, q: echomq.Queue, qname: str) -> None:
    job_id, _ = receipt(cli("enqueue", qname, "-", input=b"\x00from stdin", use_env=True))
    assert q.get_job(job_id)["payload"] == b"\x00from stdin"
    job_id, _ = receipt(cli("enqueue", qname, input=b"no payload argument", use_env=True))
    assert q.get_job(job_id)["payload"] == b"no payload argument"


def test_enqueue_task_call(cli, q: echomq.Queue, qname: str) -> None:
    result = cli(
        "enqueue", qname, "--task", "emails.send", "--args", '[1, "a"]', "--kwargs", '{"k": 2}'
    )
    job_id, _ = receipt(result)
    payload = q.get_job(job_id)["payload"]
    assert json.loads(payload) == ["emails.send", [1, "a"], {"k": 2}]
    job_id, _ = receipt(cli("enqueue", qname, "--task", "ping"))
    assert json.loads(q.get_job(job_id)["payload"]) == ["ping", []]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--args", "[1,"], "must be JSON"),
        (["--kwargs", "nope"], "must be JSON"),
        (["--args", '{"a": 1}'], "JSON list"),
        (["--kwargs", "[1]"], "JSON object"),
    ],
)
def test_enqueue_task_bad_arguments(cli, qname: str, q: echomq.Queue, args, message) -> None:
    result = cli("enqueue", qname, "--task", "t", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert q.counts()["pending"] == 0


def test_enqueue_group_delay_and_id(cli, q: echomq.Queue, qname: str) -> None:
    job_id, status = receipt(cli("enqueue", qname, "p", "--group", "acme"))
    assert status == "enqueued"
    assert q.lane_depth("acme") == 1 and q.get_job(job_id)["group"] == "acme"

    job_id, status = receipt(cli("enqueue", qname, "later", "--delay-ms", "60000"))
    assert status == "scheduled" and q.job_state(job_id) == "scheduled"

    mine = ids.mint()
    assert receipt(cli("enqueue", qname, "once", "--id", mine)) == (mine, "enqueued")
    assert receipt(cli("enqueue", qname, "twice", "--id", mine)) == (mine, "duplicate")
    assert q.get_job(mine)["payload"] == b"once"


@pytest.mark.parametrize(
    "args",
    [
        ["bad queue name", "p"],
        ["{qname}", "p", "--id", "not-an-id"],
        ["{qname}", "p", "--group", "bad lane!"],
    ],
)
def test_enqueue_invalid_input_is_one_line(cli, qname: str, q: echomq.Queue, args) -> None:
    result = cli("enqueue", *(a.format(qname=qname) for a in args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert q.counts()["pending"] == 0


def test_enqueue_task_runs_on_a_msgpack_app(cli, url: str, q: echomq.Queue, qname: str) -> None:
    """The CLI sends a JSON envelope; a worker whose app uses msgpack runs it (it used to
    dead-letter it as an undecodable payload)."""
    from worker_support import InProcWorker

    pytest.importorskip("msgpack")
    app = echomq.App(url=url, serializer="msgpack")
    seen: list[tuple[Any, ...]] = []

    @app.task(queue=qname, name="add", max_attempts=1)
    def add(a: int, b: int, *, c: int) -> None:
        seen.append((a, b, c))

    job_id, _ = receipt(
        cli("enqueue", qname, "--task", "add", "--args", "[1, 2]", "--kwargs", '{"c": 3}')
    )
    native = add.enqueue(4, 5, c=6)  # the app's own msgpack envelope beside it
    w = InProcWorker(echomq.Worker(app, beat_ms=100))
    try:
        wait_for(lambda: q.counts()["completed"] == 2)
    finally:
        stats = w.stop()
        app.close()
    assert sorted(seen) == [(1, 2, 3), (4, 5, 6)]
    assert (stats.completed, stats.dead) == (2, 0)
    assert q.job_state(job_id) == q.job_state(native.id) == "absent"


def test_enqueue_task_arguments_json_cannot_carry(cli, qname: str, q: echomq.Queue) -> None:
    result = cli("enqueue", qname, "--task", "t", "--args", "[123456789012345678901234567890]")
    assert result.exit_code == 2 and "cannot be encoded" in result.stderr, result.output
    assert q.counts()["pending"] == 0


# --------------------------------------------------------------------------- reading


def test_stats_lists_the_queue(cli, q: echomq.Queue, qname: str) -> None:
    make_dead(q)
    for _ in range(3):
        q.enqueue(b"x")
    q.enqueue(b"later", delay_ms=60_000)
    q.pause()
    out = ok(cli("stats", qname))
    line = next(ln for ln in out.splitlines() if qname in ln)
    cells = [c.strip() for c in line.split("│") if c.strip()]
    # queue, pending, active, schedule, dead, completed, failed, lanes, workers, paused
    assert cells == [qname, "3", "0", "1", "1", "0", "1", "0", "0", "yes"]
    assert "pending" in out and "dead" in out

    everything = ok(cli("stats"))  # no names: every queue found on the server
    assert qname in everything


def test_stats_discovers_queues_through_keyspace(
    cli, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    """Only keys of a legal queue's keyspace name a queue: a stray key that merely starts
    like one (a name no queue may have) is not listed, and does not fail the command."""
    q.enqueue(b"x")
    strays = ["emq:{bad name}:junk", "emq:{emq}:junk", "emq:{unclosed", f"emq:{{{qname}"]
    for key in strays:
        r.set(key, b"1")
    try:
        out = ok(cli("stats"))
    finally:
        r.delete(*strays)
    assert qname in out and "bad name" not in out and "unclosed" not in out


def test_browse(cli, q: echomq.Queue, qname: str) -> None:
    dead = make_dead(q)
    flat = [q.enqueue(b"x").id for _ in range(3)]
    lane = q.enqueue(b"y", group="g1").id
    assert ok(cli("browse", qname, "--ids")).split() == flat[::-1]  # newest first
    assert ok(cli("browse", qname, "--ids", "-n", "2")).split() == flat[::-1][:2]
    assert ok(cli("browse", qname, "--ids", "--group", "g1")).split() == [lane]
    assert ok(cli("browse", qname, "--ids", "--state", "dead")).split() == [dead]
    assert ok(cli("browse", qname, "--ids", "--state", "active")).split() == []
    bad = cli("browse", qname, "--state", "dead", "--group", "g1")
    assert bad.exit_code == 2 and "pending" in bad.stderr
    assert cli("browse", qname, "--state", "nope").exit_code == 2


def test_browse_shows_the_dashboards_columns(cli, q: echomq.Queue, qname: str) -> None:
    from echomq.protocol import envelope as _envelope
    from echomq.serializers import JSON

    dead = make_dead(q, _envelope.build(JSON(), "charge", [12], {"cur": "eur"}))
    later = q.enqueue(_envelope.build(JSON(), "remind", ["bob"]), delay_ms=600_000).id
    lines = ok(cli("browse", qname, "--state", "dead")).splitlines()
    assert lines[0].split() == [
        "id",
        "task",
        "args",
        "attempts",
        "priority",
        "error",
        "age",
        "died",
    ]
    cells = lines[1].split()
    assert cells[:5] == [dead, "charge", "12,", "cur='eur'", "1"]
    assert cells[5:7] == ["-", "boom"] and cells[7].endswith("s")
    sched = ok(cli("browse", qname, "--state", "scheduled")).splitlines()
    assert sched[0].split()[-1] == "runs"
    assert sched[1].startswith(later) and " remind " in sched[1] and " in 10.0m" in sched[1]
    urgent = q.enqueue(_envelope.build(JSON(), "page", []), priority=3).id
    waiting = ok(cli("browse", qname)).splitlines()
    assert waiting[1].startswith(urgent) and waiting[1].split()[4] == "3"  # priority column
    q.keep_completed(10)
    job = q.claim()
    assert job is not None and job.id == urgent
    q.complete(urgent, job.token)
    kept = ok(cli("browse", qname, "--state", "completed")).splitlines()
    assert kept[0].split()[-1] == "finished" and kept[1].startswith(urgent)
    assert kept[1].rstrip().endswith(" ago")
    held = q.enqueue(b"raw bytes").id
    assert q.claim() is not None
    active = ok(cli("browse", qname, "--state", "active")).splitlines()
    assert active[0].split()[-3:] == ["worker", "running", "lease"]
    assert active[1].startswith(held) and "raw bytes" in active[1]


def test_job_shows_row_and_logs(cli, q: echomq.Queue, qname: str) -> None:
    dead = make_dead(q, b"\xff\xfe")
    e = q.enqueue(b'{"task": "t"}', group="g2")
    q.add_log(e.id, "first line")
    q.add_log(e.id, "second line")
    out = ok(cli("job", qname, e.id))
    lines = out.splitlines()
    assert lines[:2] == [f"id: {e.id}", "place: pending"]
    assert 'payload: {"task": "t"}' in lines
    assert "group: g2" in lines and "attempts: 0" in lines
    assert lines[-3:] == ["logs:", "  first line", "  second line"]
    out = ok(cli("job", qname, dead))
    assert "place: dead" in out and "last_error: boom" in out
    assert "payload: b'\\xff\\xfe'" in out  # undecodable bytes are shown, not crashed on


def test_job_unknown_id_exits_1(cli, qname: str) -> None:
    missing = ids.mint()
    result = cli("job", qname, missing)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [f"id: {missing}", "place: absent"]
    bad = cli("job", qname, "nope")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ")


# --------------------------------------------------------------------------- operating


def test_reprocess_ids_and_all(cli, q: echomq.Queue, qname: str) -> None:
    one = make_dead(q)
    assert ok(cli("reprocess", qname, one)).strip() == "reprocessed 1 job(s)"
    assert q.job_state(one) == "pending"
    again = cli("reprocess", qname, one)  # not dead any more
    assert again.exit_code == 2 and again.stderr.startswith("error: "), again.output

    q.drain()
    dead = [make_dead(q) for _ in range(3)]
    assert ok(cli("reprocess", qname, "--all")).strip() == "reprocessed 3 job(s)"
    assert sorted(q.browse("pending")) == sorted(dead)
    assert q.counts()["dead"] == 0
    assert ok(cli("reprocess", qname, "--all")).strip() == "reprocessed 0 job(s)"
    none = cli("reprocess", qname)
    assert none.exit_code == 2 and "--all" in none.stderr
    assert q.check() == []


def test_reprocess_sends_a_grouped_job_back_to_its_lane(cli, q: echomq.Queue, qname: str) -> None:
    e = q.enqueue(b"x", group="g3")
    job = q.claim(lease_ms=10_000)
    assert job is not None
    q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="e")
    ok(cli("reprocess", qname, e.id))
    assert q.lane_depth("g3") == 1


def test_run_now_moves_scheduled_jobs(cli, q: echomq.Queue, qname: str) -> None:
    later = q.enqueue(b"x", delay_ms=3_600_000).id
    waiting = q.enqueue(b"y").id
    gone = echomq.ids.mint()
    out = cli("run-now", qname, later, waiting, gone)
    assert out.exit_code == 1, out.output
    assert out.output.splitlines() == [
        f"{later}: waiting",
        f"{waiting}: not scheduled",
        f"{gone}: gone",
    ]
    assert q.job_state(later) == "pending"
    assert ok(cli("run-now", qname, q.enqueue(b"z", delay_ms=60_000).id)).endswith(": waiting\n")
    bad = cli("run-now", qname, "nope")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ")


def test_change_priority(cli, q: echomq.Queue, qname: str, r: redis.Redis) -> None:
    waiting = q.enqueue(b"x").id
    later = q.enqueue(b"y", delay_ms=3_600_000).id
    job = q.enqueue(b"z")
    held = q.claim()
    assert held is not None and held.id == waiting
    q.delay(held.id, held.token, 0)
    assert ok(cli("change-priority", qname, waiting, "7")).strip() == f"{waiting}: priority 7"
    assert r.zscore(f"emq:{{{qname}}}:pending", waiting) == 7.0
    assert ok(cli("change-priority", qname, later, "2")).strip() == f"{later}: priority 2"
    active = q.claim()
    assert active is not None and active.id == job.id
    out = cli("change-priority", qname, job.id, "1")
    assert out.exit_code == 1 and out.output.strip() == f"{job.id}: not waiting or scheduled"
    gone = echomq.ids.mint()
    out = cli("change-priority", qname, gone, "1")
    assert out.exit_code == 1 and out.output.strip() == f"{gone}: gone"
    for bad in (("nope", "1"), (waiting, "-1"), (waiting, str(2**21 + 1))):
        res = cli("change-priority", "--", qname, *bad)  # "--": -1 is a value, not an option
        assert res.exit_code == 2 and res.stderr.startswith("error: "), res.stderr
    assert r.zscore(f"emq:{{{qname}}}:pending", waiting) == 7.0


def test_limit(cli, q: echomq.Queue, qname: str) -> None:
    for _ in range(3):
        q.enqueue(b"x")
    assert ok(cli("limit", qname, "2")).strip() == f"limited {qname} to 2"
    assert q.get_limit() == 2
    assert len(q.claim_batch(3)) == 2
    line = next(ln for ln in ok(cli("stats", qname)).splitlines() if qname in ln)
    cells = [c.strip() for c in line.split("│") if c.strip()]
    assert cells[-1] == "2"  # the limit column (paused is empty)
    for bad in ("0", "-1", "two", "1.5"):
        res = cli("limit", "--", qname, bad)
        assert res.exit_code == 2 and res.stderr.startswith("error: "), res.stderr
    assert q.get_limit() == 2
    assert ok(cli("limit", qname, "none")).strip() == f"unlimited {qname}"
    assert q.get_limit() is None and len(q.claim_batch(3)) == 1
    missing = cli("limit", qname + "-nope", "3")
    assert missing.exit_code == 1


def test_pause_and_resume_queue(cli, q: echomq.Queue, qname: str) -> None:
    q.enqueue(b"x")
    assert ok(cli("pause", qname)).strip() == f"paused {qname}"
    assert q.is_paused() and q.claim() is None
    assert ok(cli("resume", qname)).strip() == f"resumed {qname}"
    assert not q.is_paused() and q.claim() is not None


def test_pause_and_resume_lane(cli, q: echomq.Queue, qname: str) -> None:
    e = q.enqueue(b"x", group="slow")
    assert ok(cli("pause", qname, "--lane", "slow")).strip() == f"paused {qname} lane slow"
    assert q.claim() is None
    assert not q.is_paused()
    assert ok(cli("resume", qname, "--lane", "slow")).strip() == f"resumed {qname} lane slow"
    job = q.claim()
    assert job is not None and job.id == e.id and job.group == "slow"


def test_sweep_promotes_and_recovers(cli, q: echomq.Queue, qname: str) -> None:
    q.enqueue(b"due", delay_ms=20)
    q.enqueue(b"held")
    job = q.claim(lease_ms=20)
    assert job is not None
    time.sleep(0.1)
    assert ok(cli("sweep", qname)).strip() == "promoted 1, recovered 1, dead 0"
    assert q.counts()["pending"] == 2 and q.counts()["active"] == 0
    assert ok(cli("sweep", qname)).strip() == "promoted 0, recovered 0, dead 0"
    q.drain()

    q.enqueue(b"stalls")
    stalled = q.claim(lease_ms=20)
    assert stalled is not None
    time.sleep(0.1)
    # its first stall: at --max-stalled 1 it is dead
    assert (
        ok(cli("sweep", qname, "--max-stalled", "1")).strip() == "promoted 0, recovered 0, dead 1"
    )
    assert q.job_state(stalled.id) == "dead"
    assert q.get_job(stalled.id)["last_error"] == "stalled"

    q.enqueue(b"reaped")
    other = q.claim(lease_ms=20)
    assert other is not None
    time.sleep(0.1)
    assert (
        ok(cli("sweep", qname, "--max-stalled", "0")).strip() == "promoted 0, recovered 1, dead 0"
    )
    assert q.check() == []


def test_check_clean_and_violated(cli, q: echomq.Queue, qname: str, r: redis.Redis) -> None:
    q.enqueue(b"x")
    result = cli("check", qname)
    assert result.exit_code == 0 and result.stdout.strip() == f"{qname}: ok"
    ghost = ids.mint()
    r.zadd(f"emq:{{{qname}}}:pending", {ghost: 0})
    result = cli("check", qname)
    assert result.exit_code == 1
    assert f"{qname}: {ghost} in pending has no row (ghost)" in result.stdout.splitlines()
    r.zrem(f"emq:{{{qname}}}:pending", ghost)
    assert cli("check", qname).exit_code == 0


def test_check_several_queues(cli, q: echomq.Queue, qname: str, r: redis.Redis) -> None:
    other = qname[:100] + "-b"
    q.enqueue(b"x")  # a queue with no key at all is "no such queue", not "ok"
    r.zadd(f"emq:{{{other}}}:dead", {ids.mint(): 0})
    result = cli("check", qname, other)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{qname}: ok"
    assert any(ln.startswith(f"{other}: ") and "ghost" in ln for ln in lines[1:])
    assert cli("check").exit_code == 2  # a queue name is required


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args",
    [
        ["stats"],
        ["stats", "q1"],
        ["enqueue", "q1", "x"],
        ["browse", "q1"],
        ["job", "q1", "JOB0KHTOWnGLuC"],
        ["check", "q1"],
        ["pause", "q1"],
        ["sweep", "q1"],
        ["reprocess", "q1", "--all"],
    ],
)
def test_unreachable_server_is_one_line(args: list[str]) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(main, ["--url", dead_url, *args])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot reach the server at {dead_url}"), lines[0]


def test_worker_with_a_bad_app_spec(cli) -> None:
    result = cli("worker", "no_such_module_here:app")
    assert result.exit_code == 2 and "cannot import 'no_such_module_here'" in result.stderr
    result = cli("worker", "apps.basic:nothing")
    assert result.exit_code == 2 and "has no attribute 'nothing'" in result.stderr
    result = cli("worker", ":app")
    assert result.exit_code == 2 and "MODULE:APP" in result.stderr


def test_version_and_help(cli) -> None:
    assert echomq.__version__ in ok(cli("--version"))
    out = ok(cli("--help"))
    for command in ("worker", "enqueue", "stats", "browse", "job", "reprocess", "pause"):
        assert command in out


# --------------------------------------------------------------------------- real processes


def echomq_cli(*args: str, env: dict[str, str], input: bytes | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "echomq", *args],
        input=input,
        capture_output=True,
        env=env,
        cwd=TESTS_DIR,
        timeout=60,
        check=False,
    )


@pytest.fixture
def proc_env(url: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env["ECHOMQ_URL"] = url
    env["COLUMNS"] = "400"
    return env


def test_subprocess_enqueue_stats_check(proc_env, q: echomq.Queue, qname: str) -> None:
    done = echomq_cli("enqueue", qname, "--task", "t", "--args", "[3]", env=proc_env)
    assert done.returncode == 0, done.stderr
    job_id, status = done.stdout.decode().split()
    assert status == "enqueued" and q.job_state(job_id) == "pending"
    stats = echomq_cli("stats", qname, env=proc_env)
    assert stats.returncode == 0 and qname in stats.stdout.decode()
    check = echomq_cli("check", qname, env=proc_env)
    assert (check.returncode, check.stdout.decode().strip()) == (0, f"{qname}: ok")
    job = echomq_cli("job", qname, job_id, env=proc_env)
    assert job.returncode == 0 and "place: pending" in job.stdout.decode()


def test_subprocess_check_violation_exits_1(
    proc_env, q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    r.zadd(f"emq:{{{qname}}}:pending", {ids.mint(): 0})
    check = echomq_cli("check", qname, env=proc_env)
    assert check.returncode == 1
    assert "ghost" in check.stdout.decode()


def test_subprocess_unreachable_server(proc_env) -> None:
    proc_env["ECHOMQ_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["stats"], ["enqueue", "q1", "x"], ["check", "q1"]):
        done = echomq_cli(*args, env=proc_env)
        assert done.returncode != 0
        err = done.stderr.decode().strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("error: cannot reach the server"), err
        assert "Traceback" not in err
