"""The first hour with the ``echomq`` command (issue 14, items 5 and 6): every mistake is one
``error: ...`` line, an unreachable server is named with the time waited, ``stats`` fits 80
columns, ``job`` tells when and how often, ``remove`` and ``lanes`` exist, a queue that does
not exist is said to, an app that fails to import shows where, and ``help(echomq)`` opens with
a quick start. Real ``python -m echomq`` processes against the session server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pydoc
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from conftest import wait_for
from echomq import ids
from echomq.errors import InvalidArgument, ServerUnreachable
from echomq.server import EmbeddedServer, free_port
from procs import TESTS_DIR, Spawner, wait_log


def run(*args: str, env: dict[str, str], cwd: Path = TESTS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echomq", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


@pytest.fixture
def env(url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    clean["ECHOMQ_URL"] = url
    clean["COLUMNS"] = "80"
    return clean


def one_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a failed command (no traceback), after checking its code."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# --------------------------------------------------------------------------- 1. bad input


def test_url_without_a_scheme_is_one_line(env: dict[str, str]) -> None:
    done = run("--url", "localhost:6379", "stats", env=env)
    assert one_error(done, 2) == (
        "error: url 'localhost:6379' has no scheme: write redis://localhost:6379 "
        "(or rediss://, unix://)"
    )
    env["ECHOMQ_URL"] = "http://u:secret@host/0"  # from the environment too, password masked
    done = run("pause", "q1", env=env)
    assert one_error(done, 2) == (
        "error: url 'http://u:***@host/0' has the scheme 'http': echomq speaks redis://, "
        "rediss:// (either with +cluster) and unix://"
    )


def test_a_url_without_a_scheme_is_refused_before_any_io() -> None:
    with pytest.raises(InvalidArgument, match="has no scheme"):
        echomq.Queue("q1", url="localhost:6379")


def test_bad_log_level_is_one_line(env: dict[str, str]) -> None:
    done = run("worker", "--log-level", "LOUD", "apps.basic:app", env=env)
    assert one_error(done, 2) == (
        "error: --log-level 'LOUD' is not a level: use DEBUG, INFO, WARNING, ERROR or "
        "CRITICAL (or a number)"
    )


# --------------------------------------------------------------------------- 2. unreachable


def test_producer_gives_up_with_server_unreachable() -> None:
    port = free_port()
    q = echomq.Queue("q1", url=f"redis://:hunter2@127.0.0.1:{port}/0", retry_for=0.3)
    start = time.monotonic()
    with pytest.raises(ServerUnreachable) as caught:
        q.enqueue(b"x")
    waited = time.monotonic() - start
    q.close()
    err = caught.value
    assert waited >= 0.3, waited  # it retried for retry_for (it gives up: it raised at all)
    # Still what outage handlers catch: redis-py's ConnectionError and the builtin one.
    assert isinstance(err, redis.ConnectionError) and isinstance(err, ConnectionError)
    assert isinstance(err, echomq.EchoMQError)
    assert isinstance(err.__cause__, redis.ConnectionError)
    assert err.url == f"redis://:***@127.0.0.1:{port}/0" and err.retry_for == 0.3
    assert str(err).startswith(
        f"cannot reach the server at redis://:***@127.0.0.1:{port}/0: gave up after "
    )
    assert "of retries (retry_for=0.3); last error: " in str(err)
    assert "hunter2" not in str(err)


def test_async_producer_gives_up_with_server_unreachable() -> None:
    port = free_port()

    async def go() -> ServerUnreachable:
        aq = echomq.AsyncQueue("q1", url=f"redis://127.0.0.1:{port}/0", retry_for=0.2)
        try:
            await aq.enqueue(b"x")
        except ServerUnreachable as exc:
            return exc
        finally:
            await aq.aclose()
        raise AssertionError("enqueue succeeded without a server")

    err = asyncio.run(go())
    assert err.url == f"redis://127.0.0.1:{port}/0" and err.waited_s >= 0.2


def test_cli_names_the_unreachable_server(env: dict[str, str]) -> None:
    port = free_port()
    done = run("--url", f"redis://:hunter2@127.0.0.1:{port}/0", "enqueue", "q1", "x", env=env)
    line = one_error(done, 2)
    assert line.startswith(
        f"error: cannot reach the server at redis://:***@127.0.0.1:{port}/0: "
        "not retried (retry_for=0); last error: "
    ), line
    assert "Connection refused" in line and "hunter2" not in line


# --------------------------------------------------------------------------- 3. stats width


def test_stats_fits_80_columns_without_cutting_names(
    env: dict[str, str], qname: str, r: redis.Redis
) -> None:
    long_name = (qname.replace("-", "") + "x" * 50)[:50]
    q = echomq.Queue(long_name, url=env["ECHOMQ_URL"])
    try:
        q.enqueue(b"x")
        q.enqueue(b"y", group="tenant-a")
        done = run("stats", long_name, env=env)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), lines
        assert long_name in lines
        fields = lines[lines.index(long_name) + 1]
        assert fields == "  pending 2  active 0  schedule 0  dead 0  completed 0  failed 0  lanes 1"
        wide = run("stats", long_name, env={**env, "COLUMNS": "200"})  # a table when it fits
        row = next(line for line in wide.stdout.splitlines() if long_name in line)
        assert [c.strip() for c in row.split("│") if c.strip()][:2] == [long_name, "2"]
    finally:
        q.pause()
        q.obliterate(force=True)
        q.close()


# --------------------------------------------------------------------------- 4. job


def test_job_shows_enqueued_attempts_and_errors(
    env: dict[str, str], q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    e = q.enqueue(b"x")
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.id == e.id
    q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom: it broke")
    done = run("job", qname, e.id, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    minted = dt.datetime.fromtimestamp(ids.decode_time_ms(e.id) / 1000, dt.timezone.utc)
    stamp = minted.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert lines[:4] == [f"id: {e.id}", "place: dead", lines[2], "attempts: 1"]
    assert re.fullmatch(rf"enqueued: {re.escape(stamp)} \(0m \d+s ago\)", lines[2]), lines[2]
    assert "last_error: boom: it broke" in lines
    # The errors of each attempt (the server keeps the last 10 beside the row), in order.
    at = lines.index("errors:")
    assert lines[at : at + 2] == ["errors:", "  attempt 1: boom: it broke"]
    q.reprocess(e.id)
    job = q.claim(lease_ms=10_000)
    assert job is not None
    q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="again")
    lines = run("job", qname, e.id, env=env).stdout.splitlines()
    at = lines.index("errors:")
    assert lines[at : at + 3] == ["errors:", "  attempt 1: boom: it broke", "  attempt 1: again"]


# --------------------------------------------------------------------------- 5. remove


def test_remove_reports_each_id(env: dict[str, str], q: echomq.Queue, qname: str) -> None:
    a, b = q.enqueue(b"a").id, q.enqueue(b"b", delay_ms=60_000).id
    missing = ids.mint()
    done = run("remove", qname, a, missing, b, env=env)
    assert done.returncode == 1, done.stderr  # one was gone
    assert done.stdout.splitlines() == [f"{a}: removed", f"{missing}: gone", f"{b}: removed"]
    assert q.job_state(a) == "absent" and q.job_state(b) == "absent"
    c = q.enqueue(b"c").id
    assert run("remove", qname, c, env=env).stdout == f"{c}: removed\n"
    d = q.enqueue(b"d").id
    bad = run("remove", qname, d, "nope", env=env)  # a bad id: nothing is removed
    assert one_error(bad, 2).startswith("error: job_key requires a valid branded id, got 'nope': ")
    assert "pass it as dedup= instead" in one_error(bad, 2)
    assert q.job_state(d) == "pending"


# --------------------------------------------------------------------------- 6. no such queue


@pytest.mark.parametrize(
    "args",
    [
        ["pause"],
        ["resume"],
        ["sweep"],
        ["reprocess", "--all"],
        ["cancel", "JOB0KHTOWnGLuC"],
        ["remove", "JOB0KHTOWnGLuC"],
        ["lanes"],
        ["stats"],
        ["browse"],
        ["check"],
        ["events"],
    ],
)
def test_operator_commands_on_a_missing_queue_exit_1(
    env: dict[str, str], qname: str, r: redis.Redis, args: list[str]
) -> None:
    done = run(args[0], qname, *args[1:], env=env)
    hint = {"pause": " (--create pauses it anyway)", "resume": " (--create resumes it anyway)"}
    assert one_error(done, 1) == (
        f"error: queue {qname!r} does not exist on {env['ECHOMQ_URL']}{hint.get(args[0], '')}"
    )
    assert done.stdout == ""
    assert list(r.scan_iter(match=f"emq:{{{qname}}}*")) == []  # nothing was written


def test_pause_create_skips_the_check(env: dict[str, str], q: echomq.Queue, qname: str) -> None:
    done = run("pause", qname, "--create", env=env)
    assert (done.returncode, done.stdout) == (0, f"paused {qname}\n")
    assert q.is_paused()
    # Now it exists (its meta key holds the pause): the plain command works.
    assert run("resume", qname, env=env).stdout == f"resumed {qname}\n"


def test_events_say_when_they_are_off_and_enable_turns_them_on(
    env: dict[str, str], q: echomq.Queue, qname: str
) -> None:
    q.enqueue(b"before")
    off = run("events", qname, env=env)
    assert off.returncode == 0 and off.stdout == ""
    assert off.stderr == (
        f"events are off for {qname}: `echomq events {qname} --enable` turns them on\n"
    )
    on = run("events", qname, "--enable", env=env)
    assert (on.returncode, on.stdout) == (0, f"events on for {qname}\n")
    jid = q.enqueue(b"after").id
    shown = run("events", qname, env=env)
    assert shown.stderr == "" and f" enqueued {jid}" in shown.stdout
    assert run("events", qname, "--disable", env=env).stdout == f"events off for {qname}\n"
    assert "events are off" in run("events", qname, env=env).stderr


# --------------------------------------------------------------------------- 7. lanes


def test_lanes_list_and_set(env: dict[str, str], q: echomq.Queue, qname: str) -> None:
    q.enqueue(b"a", group="tenant-a")
    job = q.claim(lease_ms=10_000)
    assert job is not None and job.group == "tenant-a"
    q.enqueue(b"b", group="tenant-a")
    q.enqueue(b"c", group="tenant-b")
    header = "lane      depth  active  limit  weight  paused"
    done = run("lanes", qname, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        header,
        "tenant-a      1       1      -       1      no",
        "tenant-b      1       0      -       1      no",
    ]
    done = run("lanes", qname, "tenant-b", "--weight", "3", "--limit", "2", "--pause", env=env)
    assert done.stdout.splitlines() == [header, "tenant-b      1       0      2       3     yes"]
    q.pause_lane("tenant-a")
    assert q.claim() is None  # tenant-b is paused (and tenant-a, to make sure)
    q.resume_lane("tenant-a")
    done = run("lanes", qname, "tenant-b", "--no-limit", "--resume", env=env)
    assert done.stdout.splitlines() == [header, "tenant-b      1       0      -       3      no"]
    # Bad input: one line, and nothing written (the weight stays 3).
    bad = run("lanes", qname, "tenant-b", "--weight", "7", "--limit", "0", env=env)
    assert one_error(bad, 2) == "error: --limit must be >= 1 (--no-limit removes the cap), got 0"
    again = run("lanes", qname, "tenant-b", env=env).stdout.splitlines()
    assert again == [header, "tenant-b      1       0      -       3      no"]
    assert one_error(run("lanes", qname, "--weight", "2", env=env), 2) == (
        "error: name the LANE to set"
    )


def test_lanes_set_create(env: dict[str, str], q: echomq.Queue, qname: str) -> None:
    refused = run("lanes", qname, "vip", "--weight", "5", env=env)
    assert one_error(refused, 1) == (
        f"error: queue {qname!r} does not exist on {env['ECHOMQ_URL']} (--create sets it anyway)"
    )
    done = run("lanes", qname, "vip", "--weight", "5", "--create", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "vip       0       0      -       5      no"


# --------------------------------------------------------------------------- 8. import errors


def test_an_app_that_raises_on_import_shows_its_traceback(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "badmod_x.py").write_text(
        "import echomq\napp = echomq.App()\n\n\ndef setup():\n"
        '    raise RuntimeError("config missing")\n\n\nsetup()\n'
    )
    done = run("worker", "badmod_x:app", env=env, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'File "{tmp_path / "badmod_x.py"}", line 6, in setup' in done.stderr
    assert 'raise RuntimeError("config missing")' in done.stderr
    assert "cli.py" not in done.stderr and "importlib" not in done.stderr
    assert lines[-1] == (
        "error: importing 'badmod_x' raised RuntimeError: config missing (traceback above)"
    )
    missing = run("worker", "no_such_mod_x:app", env=env, cwd=tmp_path)
    assert one_error(missing, 2) == (
        f"error: cannot import 'no_such_mod_x': no module named 'no_such_mod_x' (from {tmp_path})"
    )


# --------------------------------------------------------------------------- 9. help(echomq)


def test_help_opens_with_a_quick_start_that_runs(tmp_path: Path, monkeypatch: Any) -> None:
    text = pydoc.render_doc(echomq, renderer=pydoc.plaintext)
    description = text.split("DESCRIPTION\n", 1)[1]
    assert description.lstrip().startswith("Quick start")
    block = echomq.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    code = [line[4:] for line in block.splitlines()]
    assert len(code) == 5, code
    # The five lines do what they say, against a server of their own.
    srv = EmbeddedServer(tmp_path, appendonly=False).start()
    try:
        monkeypatch.setenv("ECHOMQ_URL", srv.url)
        scope: dict[str, Any] = {}
        exec("\n".join(code), scope)
        with echomq.Queue("default", url=srv.url) as q:
            assert q.counts()["pending"] == 1
    finally:
        srv.stop()
    # The classes, functions and data it documents are the public names (__all__). pydoc
    # lists every submodule file under PACKAGE CONTENTS whatever __all__ says; the private
    # ones are marked by their leading "_" and the docstring says so.
    body = text.split("CLASSES", 1)[1]
    classes = re.findall(r"^    class (\w+)", body, flags=re.MULTILINE)
    functions = re.findall(r"^    (\w+)\(", body.split("FUNCTIONS", 1)[1], flags=re.MULTILINE)
    data = re.findall(r"^    (\w+) = ", body.split("DATA", 1)[1], flags=re.MULTILINE)
    assert "Queue" in classes and "current_job" in functions and "WIRE_VERSION" in data
    shown = {n for n in classes + functions + data if not (n.startswith("__") and n.endswith("__"))}
    assert shown <= set(echomq.__all__), shown - set(echomq.__all__)
    assert "private" in description.split("PACKAGE CONTENTS", 1)[0]


@pytest.mark.parametrize(
    "args", [["dashboard"], ["metrics"], ["worker", "apps.basic:app", "--metrics-port", "1"]]
)
def test_a_missing_extra_names_both_ways_to_install_it(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27 #10: the README installs from a clone, where 'echomq[web]' is not the
    command."""
    from click.testing import CliRunner

    from echomq.cli import main

    # The web extra's modules missing (import X: ImportError); `metrics` and
    # `--metrics-port` need only prometheus_client, the dashboard starlette too.
    monkeypatch.setitem(sys.modules, "starlette", None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2, done.output
    assert "pip install 'echomq[web]'" in done.output
    assert "from a clone of the repository: pip install '.[web]'" in done.output


# --------------------------------------------------------------------------- issue 36 #5, #7


def test_a_scheme_without_its_colon_is_mended_not_prefixed(env: dict[str, str]) -> None:
    done = run("--url", "redis//cache.internal:6380/2", "stats", env=env)
    assert one_error(done, 2) == (
        "error: url 'redis//cache.internal:6380/2' has no scheme: write "
        "redis://cache.internal:6380/2"
    )
    done = run("--url", "unix//tmp/redis.sock", "stats", env=env)
    assert one_error(done, 2).endswith("write unix:///tmp/redis.sock")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "no-such-host.invalid:6379"])
@pytest.mark.parametrize("command", [["stats"], ["stats", "q1"], ["pause", "q1"], ["workers"]])
def test_a_server_never_reached_fails_at_once(
    env: dict[str, str], host: str, command: list[str]
) -> None:
    """A refused first connect or a name that does not resolve is one line at once: not
    retried for retry_for (10 s) as a failover would be."""
    url = f"redis://{host.format(port=free_port())}/0"
    line = one_error(run("--url", url, *command, env=env), 2)
    assert line.startswith(f"error: cannot reach the server at {url}: "), line
    assert "gave up after" not in line and "retry_for=10" not in line, line
    assert "Connection refused" in line or "not known" in line or "resolution" in line, line


def test_worker_app_spec_mistakes_say_what_the_module_has(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "tasks_x.py").write_text(
        "import echomq\nmain_app = echomq.App()\nother = echomq.App()\nnot_an_app = 3\n"
    )
    done = run("worker", "tasks_x:missing", env=env, cwd=tmp_path)
    assert one_error(done, 2) == (
        "error: tasks_x has no attribute 'missing'; its echomq.App objects: main_app, other"
    )
    done = run("worker", "tasks_x:not_an_app", env=env, cwd=tmp_path)
    assert one_error(done, 2) == (
        "error: tasks_x:not_an_app is not an echomq.App (it is a int); "
        "its echomq.App objects: main_app, other"
    )
    done = run("worker", "tasks_x.py:main_app", env=env, cwd=tmp_path)
    assert one_error(done, 2).endswith("; did you mean tasks_x:main_app?")
    (tmp_path / "pkg_x").mkdir()
    (tmp_path / "pkg_x" / "__init__.py").write_text("")
    done = run("worker", "pkg_x/jobs.py", env=env, cwd=tmp_path)
    assert one_error(done, 2).endswith("; did you mean pkg_x.jobs:app?")


def test_browse_state_takes_the_peers_words(
    env: dict[str, str], q: echomq.Queue, qname: str
) -> None:
    doomed = q.enqueue(b"d").id
    job = q.claim(lease_ms=60_000)
    assert job is not None and job.id == doomed
    assert q.retry(job.id, job.token, delay_ms=0, max_attempts=1, error="boom") == "dead"
    waiting = q.enqueue(b"w").id
    later = q.enqueue(b"s", delay_ms=600_000).id
    for word, wanted in [("waiting", waiting), ("delayed", later), ("failed", job.id)]:
        done = run("browse", qname, "--state", word, "--ids", env=env)
        assert (done.returncode, done.stdout.split()) == (0, [wanted]), (word, done.stderr)
    helped = " ".join(run("browse", "--help", env=env).stdout.split())  # unwrapped
    assert "waiting = pending" in helped and "failed = dead" in helped
    assert "delayed = scheduled" in helped
    done = run("reprocess", qname, "--all", "--state", "failed", env=env)
    assert (done.returncode, done.stdout) == (0, "reprocessed 1 job(s)\n")


def test_events_enable_on_a_queue_with_no_job_yet(env: dict[str, str], qname: str) -> None:
    on = run("events", qname, "--enable", env=env)
    assert (on.returncode, on.stdout) == (0, f"events on for {qname}\n"), on.stderr
    assert on.stderr == f"note: {qname} has no job yet; its events are kept from its first\n"
    with echomq.Queue(qname, url=env["ECHOMQ_URL"]) as q:
        jid = q.enqueue(b"first").id
    shown = run("events", qname, env=env)
    assert shown.stderr == "" and f" enqueued {jid}" in shown.stdout
    # Reading or turning off the events of a queue that does not exist stays a mistake.
    assert run("events", qname + "-typo", env=env).returncode == 1
    assert run("events", qname + "-typo", "--disable", env=env).returncode == 1


def test_worker_names_its_server_once_and_stops_with_a_human_line(
    spawn: Spawner, url: str, q: echomq.Queue, qname: str
) -> None:
    proc = spawn.worker(qname, "--beat-ms", "100")
    wait_log(proc, "serving")
    e = q.enqueue(json.dumps({"task": "count", "args": [1], "kwargs": {}}).encode())
    wait_for(lambda: q.counts()["completed"] == 1, timeout=30)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.text()
    text = proc.text()
    # Where the server came from, once (ECHOMQ_URL), then the worker's own serving line.
    assert text.count(f"echomq server {url} (ECHOMQ_URL)") == 1, text
    assert "App(url=...)" not in text, text
    # A job that ends well logs no line at INFO (issue 41); the stop line counts it below.
    assert f"job {e.id} " not in text, text
    stop = re.search(r"worker \d+ stopped: (.*)$", text, re.MULTILINE)
    assert stop, text
    assert re.fullmatch(
        r"1 job done, 0 failed, 0 handed back in \d+\.\d s \(counters: claimed=1, "
        r"completed=1, .*\)",
        stop[1],
    ), stop[1]
    assert "WorkerStats(" not in text


def test_browse_never_shows_running_longer_than_age(
    env: dict[str, str], q: echomq.Queue, qname: str, r: redis.Redis
) -> None:
    """A registry entry says when its worker's beat first saw the job; written from the
    last beat's (older) server clock, it came before the job's id time: "running" was
    longer than "age". The list never shows a run longer than its job's life."""
    e = q.enqueue(b"x")
    job = q.claim(lease_ms=600_000)
    assert job is not None and job.id == e.id
    minted = ids.decode_time_ms(e.id)
    entry = {
        "host": "h", "pid": 1, "supervisor": None, "queues": [qname], "concurrency": 1,
        "executor": "lua", "version": "x", "started_ms": minted - 60_000, "ttl_ms": 600_000,
        "pool": 0, "held": 1, "jobs": [[e.id, "t", minted - 30_000]],
    }  # fmt: skip
    r.hset(f"emq:{{{qname}}}:workers", "WRK0000000000x", json.dumps(entry))
    r.zadd(f"emq:{{{qname}}}:workers:ttl", {"WRK0000000000x": int(time.time() * 1000) + 600_000})
    done = run("browse", qname, "--state", "active", env=env)
    assert done.returncode == 0, done.stderr
    head, row = done.stdout.splitlines()
    cells = dict(zip(head.split(), row.split(), strict=False))
    age, running = cells["age"], cells["running"]
    assert age.endswith("s") and running.endswith("s"), done.stdout
    assert float(running[:-1]) <= float(age[:-1]), done.stdout
