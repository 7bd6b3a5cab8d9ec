"""The supervisor's restart policy with real processes (issue 39): a child that ran jobs
before dying crashed, and is restarted (backing off) however often it happens; a child that
dies before it was ready and before any job failed to start, and after five of those in a
row the supervisor gives up with exit status 3 (a broken deploy)."""

from __future__ import annotations

import signal
from pathlib import Path

import echomq
from conftest import wait_for
from echomq.protocol import envelope as _envelope
from echomq.runtime import supervisor as _supervisor
from echomq.serializers import JSON
from procs import Proc, Spawner, wait_log

CRASHES = _supervisor.MAX_FAILED_STARTS + 1  # more than a failed start may ever be


def crashy(spawn: Spawner, queue: str, *options: str, **extra: str) -> Proc:
    env = spawn.env(EMQ_TEST_QUEUE=queue, **extra)
    return spawn.start("worker", "apps.crashy:app", *options, env=env)


def test_children_that_crash_after_running_jobs_are_restarted_every_time(
    spawn: Spawner, q: echomq.Queue, qname: str, tmp_path: Path
) -> None:
    markers = [tmp_path / f"ran-{i}" for i in range(CRASHES)]
    for i, marker in enumerate(markers):  # each job kills the child that runs it
        how = "kill" if i % 2 else "exit"
        q.enqueue(_envelope.build(JSON(), "crash", (str(marker), how), {}))
    # One supervised child (a per-child job cap makes -p 1 supervised), so every crash is
    # the same child's, in a row.
    sup = crashy(spawn, qname, "-p", "1", "--max-jobs-per-child", "100", "-c", "1")
    wait_for(lambda: all(m.exists() for m in markers) or sup.popen.poll() is not None, 180)
    assert sup.popen.poll() is None, sup.text()
    # The last crash was logged as one, and a new child started after it: still going.
    wait_log(sup, f"(crash {CRASHES} in a row)", timeout=120)
    wait_for(lambda: sup.text().count("worker 0 started") > CRASHES, 120)
    text = sup.text()
    assert sup.popen.poll() is None, text
    assert text.count("exited after running jobs") >= CRASHES, text
    assert "killed by SIGKILL" in text and "exit status 1" in text, text
    assert "failed to start" not in text, text
    pids = {m.read_text() for m in markers}
    assert len(pids) == CRASHES  # each job ran in a child of its own, once
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.text()


def test_children_that_never_start_make_the_supervisor_give_up(
    spawn: Spawner, q: echomq.Queue, qname: str
) -> None:
    # The supervisor imports the app; each spawned child fails to (a broken deploy).
    sup = crashy(spawn, qname, "-p", "2", EMQ_TEST_BREAK_CHILDREN="1", ECHOMQ_START_METHOD="spawn")
    assert sup.wait(180) == _supervisor.EXIT_FAILING, sup.text()
    text = sup.text()
    assert f"failed to start {_supervisor.MAX_FAILED_STARTS} times in a row" in text, text
    assert "cannot import" in text, text
    assert "a crash" not in text, text
