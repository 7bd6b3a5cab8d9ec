"""echomq's backend for Django's task framework, end to end in a real Django project
(tests/contrib/django_project: settings, @task functions, a view that enqueues and a view
that reads the result). Django's test Client hits the views in this process; a real
``echomq worker echomq.contrib.django.worker:app`` subprocess runs the tasks against the
test's server, on both executors.

This runs on the suite's Python (CI: 3.11, Django 5.2 with the ``django-tasks`` backport).
Django 6's own ``django.tasks`` needs Python >= 3.12: tests/contrib/test_django6.py runs
the same project on it, from a venv of its own, when the machine has such a Python.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest

# The project's settings, once for this process (the test overrides TASKS with its server).
os.environ["DJANGO_SETTINGS_MODULE"] = "django_project.settings"
django.setup()
os.environ.pop("DJANGO_SETTINGS_MODULE")

from django.test import Client, override_settings  # noqa: E402
from django_project import tasks  # noqa: E402

import echomq  # noqa: E402
from conftest import wait_for  # noqa: E402
from echomq.contrib.django import _api  # noqa: E402
from echomq.contrib.django.backend import echomq_priority  # noqa: E402
from procs import Proc, Spawner, wait_log  # noqa: E402

pytestmark = pytest.mark.executors

CONTRIB = Path(__file__).resolve().parent
QUEUES = ["default", "reports"]


def backend() -> Any:
    from django.utils.module_loading import import_string

    # django.tasks (Django 6) or the backport: the same handler object either way.
    handler = import_string(f"{_api.SOURCE}.task_backends")
    return handler["default"]


@pytest.fixture
def project(url: str, spawn: Spawner) -> Iterator[Spawner]:
    """The project's TASKS on the test's server, and nothing left on its queues."""
    tasks_setting = {
        "default": {
            "BACKEND": "echomq.contrib.django.backend.EchoMQBackend",
            "QUEUES": QUEUES,
            "OPTIONS": {"URL": url, "RESULT_TTL_MS": 600_000},
        }
    }
    with override_settings(TASKS=tasks_setting):
        app = backend().app
        for name in QUEUES:
            app.queue(name).pause()
            app.queue(name).obliterate(force=True)
        yield spawn
        app.close()


def start_worker(spawn: Spawner, *options: str) -> Proc:
    env = spawn.env(
        DJANGO_SETTINGS_MODULE="django_project.settings",
        PYTHONPATH=os.pathsep.join([str(CONTRIB), spawn.env()["PYTHONPATH"]]),
    )
    proc = spawn.start("worker", "echomq.contrib.django.worker:app", *options, env=env)
    wait_log(proc, "queue reports: tasks django:reports")
    return proc


def finished(result_id: str) -> Any:
    """The result once it is SUCCESSFUL or FAILED (polled with a generous deadline)."""
    return wait_for(lambda: (r := backend().get_result(result_id)).is_finished and r, 60)


def written(app: echomq.App) -> dict[str, int]:
    counts = {}
    for name in QUEUES:
        for state, n in app.queue(name).counts().items():
            counts[f"{name}.{state}"] = n
    return counts


def test_views_enqueue_and_read_a_result_through_a_real_worker(project: Spawner) -> None:
    client = Client()
    sent = client.get("/add/", {"a": 2, "b": 40}).json()
    assert sent["status"] == "READY"
    # Not run yet: the result view reads READY from the job's state.
    assert client.get(f"/result/{sent['id']}/").json()["status"] == "READY"
    start_worker(project)
    wait_for(lambda: client.get(f"/result/{sent['id']}/").json()["status"] == "SUCCESSFUL")
    body = client.get(f"/result/{sent['id']}/").json()
    assert body == {"id": sent["id"], "status": "SUCCESSFUL", "task": "add", "value": 42}
    result = tasks.add.get_result(sent["id"])  # Task.get_result checks the task too
    assert result.return_value == 42
    assert result.args == [2, 40] and result.kwargs == {}
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert len(result.worker_ids) == 1 and result.attempts == 1
    assert client.get("/result/JOB0000000000x/").status_code == 404


def test_a_failing_task_reads_failed_with_its_error(project: Spawner) -> None:
    client = Client()
    start_worker(project)
    sent = client.get("/explode/", {"message": "kaput"}).json()
    result = finished(sent["id"])
    assert result.status == _api.TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: kaput" in error.traceback
    assert "def explode" in error.traceback or "raise ValueError" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    body = client.get(f"/result/{sent['id']}/").json()
    assert body["status"] == "FAILED" and body["error"] == "builtins.ValueError"
    # Django tasks are not retried: one run, dead-lettered.
    assert backend().app.queue("default").job_state(sent["id"]) == "dead"


def test_kwargs_other_queue_async_task_and_context(project: Spawner) -> None:
    start_worker(project)
    r1 = tasks.report.enqueue([1, 2, 3], title="q3")
    r2 = tasks.whoami.enqueue()

    async def produce() -> Any:
        try:
            return await tasks.shout.aenqueue("hi")
        finally:
            await backend().app.aclose()

    r3 = asyncio.run(produce())
    assert r1.task.queue_name == "reports"
    assert finished(r1.id).return_value == {"title": "q3", "total": 6}
    assert backend().app.queue("reports").result(r1.id) is not None  # it ran on "reports"
    assert backend().app.queue("default").result(r1.id) is None
    assert finished(r1.id).kwargs == {"title": "q3"}
    assert finished(r2.id).return_value == {"id": r2.id, "attempt": 1}
    assert finished(r3.id).return_value == "HI"


def test_priority_is_honoured(project: Spawner, tmp_path: Path) -> None:
    order = tmp_path / "order"
    gate = tmp_path / "gate"
    start_worker(project, "-c", "1")
    blocker = tasks.wait_for_file.enqueue(str(gate))
    q = backend().app.queue("default")
    wait_for(lambda: q.job_state(blocker.id) == "active")
    # Enqueued while the only slot is held: they wait, and run by priority, higher first.
    low = tasks.record.using(priority=-50).enqueue(str(order), "low")
    mid = tasks.record.enqueue(str(order), "mid")
    high = tasks.record.using(priority=90).enqueue(str(order), "high")
    gate.touch()
    for r in (low, mid, high):
        finished(r.id)
    assert order.read_text().split() == ["high", "mid", "low"]
    assert [echomq_priority(p) for p in (90, 0, -50)] == [10, 100, 150]


def test_run_after_defers_the_job(project: Spawner) -> None:
    start_worker(project)
    q = backend().app.queue("default")
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    far = tasks.add.using(run_after=later).enqueue(1, 1)
    assert q.job_state(far.id) == "scheduled"
    assert backend().get_result(far.id).status == _api.TaskResultStatus.READY
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    near = tasks.add.using(run_after=soon).enqueue(2, 2)
    result = finished(near.id)
    assert result.return_value == 4
    assert result.started_at >= soon - dt.timedelta(milliseconds=50)  # never before run_after
    assert q.job_state(far.id) == "scheduled"  # still waiting for its hour


def test_bad_input_is_djangos_typed_error_and_writes_nothing(project: Spawner) -> None:
    app = backend().app
    before = written(app)
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)  # not JSON
    with pytest.raises(_api.InvalidTaskError, match="not valid"):
        tasks.add.using(queue_name="nope").enqueue(1, 2)  # not one of QUEUES
    with pytest.raises(_api.InvalidTaskError, match="priority"):
        tasks.add.using(priority=101).enqueue(1, 2)
    with pytest.raises(_api.InvalidTaskError, match="aware"):
        tasks.add.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1, 2)  # naive, USE_TZ
    with pytest.raises(_api.TaskResultDoesNotExist):
        backend().get_result("not-an-id")
    assert written(app) == before


def test_a_queue_echomq_cannot_name_is_refused_at_startup(url: str) -> None:
    bad = {
        "default": {
            "BACKEND": "echomq.contrib.django.backend.EchoMQBackend",
            "QUEUES": ["has space"],
            "OPTIONS": {"URL": url},
        }
    }
    with override_settings(TASKS=bad), pytest.raises(_api.InvalidTaskError, match="QUEUES"):
        backend()


def test_the_import_switch_picks_django_tasks_on_django_6() -> None:
    # Django >= 6 has django.tasks, and the backend uses it even with the backport installed;
    # before 6 the backport is the only source.
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == _api.SOURCE
    assert _api.TaskResult.__module__ == f"{expected}.base"
