"""The worker's log lines (docs/API.md, "Logs"): a real ``echomq worker`` process running
tests/apps/logs.py writes one line per failure, timeout, retry, dead-letter, unknown task and
cancel — in text and in JSON (``--log-format json``) — and its startup lines name the tasks,
the masked server URL, the executor and the concurrency. A refused (stale) settle is logged
too, checked in-process."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from worker_support import InProcWorker

import echomq
from conftest import tmp_server, wait_for
from echomq import App, Worker
from echomq.runtime.logfmt import JsonFormatter
from procs import Proc, Spawner, wait_log

LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR) (echomq[\w.]*)\[\d+\] (.*)$")


def call(task: str, *args: object) -> bytes:
    return json.dumps({"task": task, "args": list(args), "kwargs": {}}).encode()


def start(spawn: Spawner, queue: str, url: str, *options: str) -> Proc:
    env = spawn.env(EMQ_TEST_QUEUE=queue, ECHOMQ_URL=url)
    proc = spawn.start("worker", "apps.logs:app", "-c", "8", "--beat-ms", "100", *options, env=env)
    wait_log(proc, "serving")
    return proc


def enqueue_all(q: echomq.Queue) -> dict[str, str]:
    """One job per line; ``wait`` is cancelled once it runs. Returns task -> job id."""
    ids = {}
    for task, args in [
        ("fail", ("x",)),
        ("die", ()),
        ("slow", ()),
        ("again", ()),
        ("nope", ()),
        ("ok", ()),
        ("wait", ()),
    ]:
        receipt = q.enqueue(call(task, *args))
        ids[task] = receipt.id
    wait_for(lambda: q.job_state(ids["wait"]) == "active", timeout=60)
    assert q.cancel(ids["wait"]) == "signalled"
    return ids


def text_lines(proc: Proc) -> list[tuple[str, str, str]]:
    """(level, logger, message) of every log line of the process."""
    found = (LINE.match(x) for x in proc.text().splitlines())
    return [(m[1], m[2], m[3]) for m in found if m]


def block_after(text: str, line: str) -> list[str]:
    """The lines that follow ``line`` up to the next log line (its traceback, if any)."""
    after = text.split(line + "\n", 1)[1].splitlines()
    end = next((i for i, x in enumerate(after) if LINE.match(x)), len(after))
    return after[:end]


def test_text_lines_name_queue_job_task_attempt(spawn: Spawner, tmp_path: Path) -> None:
    srv = tmp_server(tmp_path / "redis", appendonly=False)
    try:
        redis.Redis.from_url(srv.url).config_set("requirepass", "s3cret")
        url = srv.url.replace("redis://", "redis://:s3cret@")
        queue = "logs-text"
        proc = start(spawn, queue, url)
        with echomq.Queue(queue, url=url) as q:
            ids = enqueue_all(q)
            wait_log(proc, "cancelled: dead-lettered")
            wait_for(lambda: q.counts()["dead"] == 3, timeout=60)  # die, nope, wait
            # last_error's traceback starts at the handler too (the sync one: a pool thread).
            kept = q.get_job(ids["fail"])
            assert kept is not None
            error = kept["last_error"]
            error = error.decode() if isinstance(error, bytes) else error
            tb = error.split("Traceback (most recent call last):\n", 1)[1].splitlines()
            assert "apps/logs.py" in tb[0] and "runtime/runner.py" not in error, error
        text = proc.text()
        lines = text_lines(proc)
        where = {
            t: f"job {i} (task {t}, queue {queue}, attempt 1/{n})"
            for (t, i), n in zip(ids.items(), [3, 1, 2, 4, 0, 3, 3], strict=True)
        }
        jobs = "echomq.worker.jobs"
        expected = [
            ("WARNING", jobs, f"{where['fail']} failed: ValueError: boom: x; retrying in 60000 ms"),
            ("ERROR", jobs, f"{where['die']} dead-lettered: KeyError: 'last straw'"),
            (
                "WARNING",
                jobs,
                f"{where['slow']} timed out: TimeoutError: the run took longer than 0.2s; "
                "retrying in 60000 ms",
            ),
            (
                "INFO",
                jobs,
                f"{where['again']} retry requested: Retry: not yet; retrying in 45000 ms",
            ),
            (
                "ERROR",
                jobs,
                f"job {ids['nope']} (task nope, queue {queue}, attempt 1) unknown task 'nope': "
                "no handler is registered: dead-lettered",
            ),
            ("INFO", jobs, f"{where['wait']} cancelled: dead-lettered"),
        ]
        for line in expected:
            assert line in lines, f"{line} not in:\n{text}"
        job_lines = [x for x in lines if x[1] == jobs]
        # At INFO (the default) a run's start and a job's completion log nothing (issue 41:
        # they cost twice all else of a no-op job; --log-level DEBUG shows them): every job
        # line is one of the outcomes above.
        assert sorted(job_lines) == sorted(expected), job_lines
        # The failure and the dead-letter carry the handler's traceback, right under them.
        for first, last in [
            (expected[0][2], "ValueError: boom: x"),
            (expected[1][2], "KeyError: 'last straw'"),
        ]:
            after = block_after(text, first)
            assert after[0] == "Traceback (most recent call last):"
            # Issue 36 #7: it starts at the handler, no frame of echomq's runner first.
            assert "apps/logs.py" in after[1], after
            assert not any("echomq/runtime/runner.py" in x for x in after), after
            assert after[-1] == last
        # No traceback for a signal, a timeout, a cancel.
        assert text.count("Traceback (most recent call last)") == 2
        # Startup: the masked URL, the executor, the concurrency, the tasks of the queue.
        port = srv.url.rsplit(":", 1)[1]
        assert "s3cret" not in text
        started = [m for lvl, lg, m in lines if lvl == "INFO" and lg == "echomq.worker"]
        assert re.fullmatch(
            rf"worker \d+ serving {queue} with concurrency 8 on redis://:\*\*\*@127\.0\.0\.1:"
            rf"{port} \(executor lua\)",
            started[0],
        ), started
        assert started[1] == f"queue {queue}: tasks again, die, fail, ok, slow, wait"
    finally:
        spawn.stop_all()
        srv.stop()


def test_json_lines_carry_the_fields(spawn: Spawner, url: str, qname: str) -> None:
    proc = start(spawn, qname, url, "--log-format", "json", "--log-level", "DEBUG")
    with echomq.Queue(qname, url=url) as q:
        ids = enqueue_all(q)
        wait_log(proc, "cancelled: dead-lettered")
        wait_log(proc, "completed in")
    records = [json.loads(x) for x in proc.text().splitlines() if x.startswith("{")]
    for rec in records:
        assert {"ts", "level", "logger", "msg"} <= rec.keys()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec["ts"])
    jobs = {rec["task"]: rec for rec in records if rec["logger"] == "echomq.worker.jobs"}
    base = {"logger": "echomq.worker.jobs", "queue": qname, "attempt": 1}

    def check(task: str, level: str, **fields: Any) -> dict[str, Any]:
        rec = jobs[task]
        want = {**base, "level": level, "job_id": ids[task], "task": task, **fields}
        assert {k: rec.get(k) for k in want} == want, rec
        return rec

    fail = check("fail", "WARNING", max_attempts=3, delay_ms=60_000, error="ValueError: boom: x")
    assert fail["exc"].startswith("Traceback (most recent call last):")
    assert fail["exc"].endswith("ValueError: boom: x")
    die = check("die", "ERROR", max_attempts=1, error="KeyError: 'last straw'")
    assert "KeyError: 'last straw'" in die["exc"]
    slow = check(
        "slow", "WARNING", delay_ms=60_000, error="TimeoutError: the run took longer than 0.2s"
    )
    again = check("again", "INFO", max_attempts=4, delay_ms=45_000, error="Retry: not yet")
    nope = check("nope", "ERROR", error="unknown task 'nope': no handler is registered")
    wait = check("wait", "INFO", error="cancelled")
    for rec in (slow, again, nope, wait):
        assert "exc" not in rec
    ok = check("ok", "DEBUG", max_attempts=3)
    assert isinstance(ok["duration_ms"], float) and ok["duration_ms"] >= 0
    assert ok["msg"].endswith(f"completed in {ok['duration_ms']} ms")
    started = [r for r in records if r["logger"] == "echomq.worker" and "tasks" in r]
    assert started[0]["tasks"] == ["again", "die", "fail", "ok", "slow", "wait"]
    serving = next(r for r in records if "serving" in r["msg"])
    assert (serving["executor"], serving["concurrency"]) == ("lua", 8)


def test_worker_refuses_an_unknown_log_format(spawn: Spawner, qname: str) -> None:
    proc = spawn.start("worker", "apps.logs:app", "--log-format", "yaml")
    assert proc.wait(60) == 2
    assert "'yaml' is not one of 'text', 'json'" in proc.text()


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_stale_settle_is_logged(url: str, qname: str, q: echomq.Queue) -> None:
    """The handler returns after its job was handed back and claimed again: the settle is
    refused (a newer token holds the job) and the worker says so, naming the job."""
    app = App(url=url)
    started, release = threading.Event(), threading.Event()

    @app.task(queue=qname, name="held")
    def held() -> None:
        started.set()
        release.wait(60)

    capture = Capture()
    logger = logging.getLogger("echomq.worker")
    logger.addHandler(capture)
    # One slot, held by the handler: the worker cannot claim the job again itself.
    handle = InProcWorker(Worker(app, concurrency=1, beat_ms=100))
    try:
        job_id = q.enqueue(call("held")).id
        assert started.wait(60)
        q.delay(job_id, 1, 0)  # handed back under the running handler
        newer = wait_for(q.claim)
        assert (newer.id, newer.token) == (job_id, 2)
        release.set()
        wait_for(lambda: [r for r in capture.records if "stale settle" in r.getMessage()])
    finally:
        release.set()
        stats = handle.stop()
        logger.removeHandler(capture)
        app.close()
    (rec,) = [r for r in capture.records if "stale settle" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    assert rec.getMessage().startswith(
        f"job {job_id} (task held, queue {qname}, attempt 1) stale settle refused: "
        "a newer token holds it"
    )
    out = json.loads(JsonFormatter().format(rec))
    assert {k: out[k] for k in ("queue", "job_id", "task", "attempt")} == {
        "queue": qname, "job_id": job_id, "task": "held", "attempt": 1,
    }  # fmt: skip
    assert stats.stale_refused == 1


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_start_and_completion_lines_at_debug_not_at_info(
    url: str, qname: str, q: echomq.Queue, level: str
) -> None:
    app = App(url=url)

    @app.task(queue=qname, name="fine")
    async def fine() -> None:
        return None

    capture = Capture()
    logger = logging.getLogger("echomq.worker.jobs")
    logger.addHandler(capture)
    old = logger.level
    logger.setLevel(level)
    handle = InProcWorker(Worker(app, beat_ms=100))
    try:
        q.enqueue(call("fine"))
        wait_for(lambda: q.counts()["completed"] == 1)
    finally:
        handle.stop()
        logger.setLevel(old)
        logger.removeHandler(capture)
        app.close()
    lines = [r.getMessage() for r in capture.records]
    if level == "INFO":  # the default: a job that ends well logs nothing (issue 41)
        assert lines == []
    else:
        # The run's start line, then its end line (issue 36 #7), both at DEBUG.
        assert len(lines) == 2 and lines[0].endswith(
            " (task fine, queue " + qname + ", attempt 1/3) started"
        )
        assert re.search(r"\) completed in [\d.]+ ms$", lines[1])
        assert [r.levelno for r in capture.records] == [logging.DEBUG, logging.DEBUG]


def test_start_lists_repeats_and_warns_of_a_queue_without_tasks(url: str, qname: str) -> None:
    """Issue 27 #5: the registered repeats are named at start, and `-q typo` (a served queue
    no task is on) is a warning, not a silent `tasks (none)`."""
    app = App(url=url)

    @app.periodic(every_ms=60_000, queue=qname, name="hourly-ish")
    def tick() -> None:
        return None

    @app.periodic(cron="0 3 * * *", tz="Europe/Paris", queue=qname, name="nightly")
    def night() -> None:
        return None

    capture = Capture()
    logger = logging.getLogger("echomq.worker")
    logger.addHandler(capture)
    old = logger.level
    logger.setLevel(logging.INFO)
    typo = qname[:60] + "-typo"
    handle = InProcWorker(Worker(app, [qname, typo], beat_ms=100))
    try:
        wait_for(lambda: [r for r in capture.records if "no task of the app" in r.getMessage()])
    finally:
        handle.stop()
        logger.setLevel(old)
        logger.removeHandler(capture)
        app.close()
    by_text = {r.getMessage(): r.levelno for r in capture.records}
    assert by_text[f"queue {qname}: tasks {', '.join(sorted([night.name, tick.name]))}"] == 20
    repeats = (
        f"queue {qname}: repeats hourly-ish (every 60000 ms, task {tick.name}), "
        f"nightly (cron '0 3 * * *' Europe/Paris, task {night.name})"
    )
    assert by_text[repeats] == logging.INFO, by_text
    warned = (
        f"queue {typo}: no task of the app is on it (its queues: {qname}); a job there is "
        "dead-lettered as an unknown task"
    )
    assert by_text[warned] == logging.WARNING, by_text


def test_an_outage_warns_once_per_kind_and_says_when_it_reconnected(
    tmp_path: Path, qname: str
) -> None:
    """Issue 27 #5: during an outage every loop of the worker warned several times a second;
    now each warning is written once (then at most every 10 s, counting the rest), and the
    return is one line with the outage's length."""
    srv = tmp_server(tmp_path / "redis", appendonly=False)
    app = App(url=srv.url)

    @app.task(queue=qname, name="t")
    def t() -> None:
        return None

    capture = Capture()
    logger = logging.getLogger("echomq.worker")
    logger.addHandler(capture)
    old = logger.level
    logger.setLevel(logging.INFO)
    handle = InProcWorker(Worker(app, beat_ms=100))
    try:
        wait_for(lambda: [r for r in capture.records if "serving" in r.getMessage()])
        srv.kill()
        wait_for(lambda: [r for r in capture.records if r.levelno == logging.WARNING])
        time.sleep(3)  # 30 beats, and a waker that parks every beat: many failed calls
        srv.start()
        back = wait_for(
            lambda: [r for r in capture.records if "reconnected after" in r.getMessage()],
            timeout=15,
        )
        with echomq.Queue(qname, url=srv.url) as q:
            q.enqueue(call("t"))
            wait_for(lambda: q.counts()["completed"] == 1, timeout=60)
    finally:
        handle.stop()
        logger.setLevel(old)
        logger.removeHandler(capture)
        app.close()
        srv.stop()
    assert len(back) == 1, [r.getMessage() for r in back]
    m = re.fullmatch(r"server reachable again: reconnected after ([\d.]+) s", back[0].getMessage())
    assert m and 2.5 <= float(m[1]) < 15, back[0].getMessage()
    warnings = [r for r in capture.records if r.levelno == logging.WARNING]
    kinds: dict[str, int] = {}
    for r in warnings:
        kinds[str(r.msg)] = kinds.get(str(r.msg), 0) + 1
    assert kinds and all(n == 1 for n in kinds.values()), kinds
