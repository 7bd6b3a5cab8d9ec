"""echomq's Django task backend on real Django 6 (issue 40): ``django.tasks`` itself, not the
``django-tasks`` backport that tests/contrib/test_django.py runs on Python 3.11.

Django 6 needs Python >= 3.12, so this module finds one: ``python3.13``/``python3.12`` on
PATH, then pyenv's ``$PYENV_ROOT/versions/3.1x`` (PYENV_ROOT by default ``/root/.pyenv``);
with none the module is skipped, and says why. It makes a venv in the session's tmp dir
and installs into it what a user would: ``pip install "<this checkout>[django]"
"django>=6,<7"`` (the extra brings the backport too, so the import switch in
``echomq.contrib.django._api`` must *prefer* ``django.tasks``).

Then, from that venv, with tests/contrib/django_project as the project
(``DJANGO_SETTINGS_MODULE``, its ``TASKS`` on echomq's backend; ``ECHOMQ_URL`` the test's
server), on both executors: the venv's ``echomq worker echomq.contrib.django.worker:app``
starts, and a script enqueues ``@task`` functions through Django 6's ``Task.enqueue`` and
polls ``get_result(id)``: SUCCESSFUL with the return value, FAILED with the error class.
Nothing of the checkout's ``src/`` is on the venv's path: the test checks which echomq and
which Django ran, in the script and (by the failing task's traceback) in the worker.

The pip cache is the user's (``PIP_CACHE_DIR`` if set, else pip's default under the user's
HOME, not the session's private one), so a second session does not download Django again.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conftest
from procs import Spawner, wait_log

# A venv and a pip install (a minute or two on a cold cache), then two legs of a few seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.executors]

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "tests" / "contrib"
# pyenv's Pythons (PYENV_ROOT, else where the CI image and this machine keep them).
PYENV_VERSIONS = os.path.join(os.environ.get("PYENV_ROOT") or "/root/.pyenv", "versions")


def python_version(exe: str) -> tuple[int, int] | None:
    """``exe``'s (major, minor), or None if it does not run (a pyenv shim for a version
    that is not selected exits 127)."""
    try:
        done = subprocess.run(
            [exe, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    major, minor = done.stdout.split()
    return int(major), int(minor)


def find_python_312() -> str | None:
    """The first Python >= 3.12 that runs: PATH's python3.13/3.12, then pyenv's."""
    on_path = [shutil.which(name) for name in ("python3.13", "python3.12")]
    pyenv = sorted(glob.glob(f"{PYENV_VERSIONS}/3.1[2-9]*/bin/python3.1[2-9]"), reverse=True)
    for exe in [*(p for p in on_path if p), *pyenv]:
        version = python_version(exe)
        if version is not None and version >= (3, 12):
            return exe
    return None


def users_pip_cache() -> str:
    """The pip cache of the user who ran pytest: conftest gave the session a private HOME
    and XDG_CACHE_HOME (emptied at its end), which would make every run download Django."""
    users = conftest._saved_env or os.environ
    if users.get("PIP_CACHE_DIR"):
        return users["PIP_CACHE_DIR"]
    cache = users.get("XDG_CACHE_HOME") or os.path.join(users.get("HOME", "/"), ".cache")
    return os.path.join(cache, "pip")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv (its root) with this checkout's echomq[django] and Django 6, built once."""
    python = find_python_312()
    if python is None:
        pytest.skip(
            "Django 6 needs Python >= 3.12: no python3.13/python3.12 that runs on PATH, "
            f"nor {PYENV_VERSIONS}/3.1x"
        )
    path = tmp_path_factory.mktemp("django6") / "venv"
    # --without-pip, filled by the project venv's pip (`pip --python`): quicker than
    # bootstrapping pip into it, and the same install.
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    env = {**os.environ, "PIP_CACHE_DIR": users_pip_cache()}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(path / "bin" / "python")),
            *("install", "-q", "--no-compile", f"{ROOT}[django]", "django>=6,<7"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return path


def venv_env(spawn: Spawner, venv: Path) -> dict[str, str]:
    """A shell with the venv active, the test's server in ``ECHOMQ_URL`` and the Django
    project importable; nothing of the suite's PYTHONPATH (the checkout's src/, tests/)."""
    env = spawn.env(
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PYTHONPATH=str(CONTRIB),
        DJANGO_SETTINGS_MODULE="django_project.settings",
    )
    return {k: v for k, v in env.items() if k != "PYTHONHOME"}


def run_python(venv: Path, env: dict[str, str], code: str, *argv: str) -> dict[str, object]:
    """Run ``code`` with the venv's python; its last stdout line, as JSON."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", textwrap.dedent(code), *argv],
        cwd=CONTRIB,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# Enqueues through Django 6's own API, then polls get_result until the worker has run both
# tasks; reports what ran where.
SCRIPT = """
    import json, sys, time
    import django
    django.setup()
    import django_tasks
    import echomq
    from django.tasks import task_backends
    from django_project import tasks
    from echomq.contrib.django import _api

    backend = task_backends["default"]
    ok = tasks.add.enqueue(2, 40)
    bad = tasks.explode.enqueue("kaput")
    sent = ok.status
    deadline = time.monotonic() + 120
    while not (ok.is_finished and bad.is_finished) and time.monotonic() < deadline:
        time.sleep(0.05)
        ok, bad = backend.get_result(ok.id), backend.get_result(bad.id)
    print(json.dumps({
        "python": sys.version,
        "python_3_12_or_later": sys.version_info >= (3, 12),
        "django": django.__version__,
        "django_major": django.VERSION[0],
        "source": _api.SOURCE,
        "backport_installed": bool(django_tasks.__file__),
        "backend": type(backend).__module__ + "." + type(backend).__name__,
        "result_class": type(ok).__module__ + "." + type(ok).__name__,
        "echomq": echomq.__file__,
        "sent_status": sent,
        "ok_status": ok.status,
        "ok_value": ok.return_value if ok.status == "SUCCESSFUL" else None,
        "ok_workers": len(ok.worker_ids),
        "bad_status": bad.status,
        "bad_errors": [e.exception_class_path for e in bad.errors],
        "bad_traceback": bad.errors[-1].traceback if bad.errors else "",
    }))
"""


def test_django_6_tasks_enqueue_run_and_read_through_a_real_worker(
    venv: Path, spawn: Spawner
) -> None:
    env = venv_env(spawn, venv)
    # The worker starts while the script sets Django up: both are a few seconds of imports.
    worker = spawn.start(
        "worker",
        "echomq.contrib.django.worker:app",
        env=env,
        cwd=CONTRIB,
        command=[str(venv / "bin" / "echomq")],
    )
    got = run_python(venv, env, SCRIPT)
    assert "queue reports: tasks django:reports" in wait_log(worker, "django:reports")
    assert got["python_3_12_or_later"] is True and got["django_major"] == 6, got
    # The backport is installed (echomq[django] brings it), yet Django 6's own module is used.
    assert got["backport_installed"] is True
    assert got["source"] == "django.tasks"
    assert got["result_class"] == "django.tasks.base.TaskResult"
    assert got["backend"] == "echomq.contrib.django.backend.EchoMQBackend"
    assert str(got["echomq"]).startswith(str(venv)), "echomq must come from the venv's install"
    assert got["sent_status"] == "READY"
    assert got["ok_status"] == "SUCCESSFUL", (got, worker.text())
    assert got["ok_value"] == 42 and got["ok_workers"] == 1
    assert got["bad_status"] == "FAILED", (got, worker.text())
    assert got["bad_errors"] == ["builtins.ValueError"]
    # The worker ran it in the venv: its echomq and Django 6's django.tasks called the task.
    traceback = str(got["bad_traceback"])
    assert "ValueError: kaput" in traceback
    site = str(got["echomq"]).rsplit("/echomq/", 1)[0]
    assert f"{site}/echomq/contrib/django/_jobs.py" in traceback, traceback
    assert f"{site}/django/tasks/base.py" in traceback, traceback
