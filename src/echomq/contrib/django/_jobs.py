"""How a Django task travels as an echomq job, and how its outcome is read back.

One echomq task per queue, ``django:<queue>``, runs every Django task of that queue: its
arguments are the Django task's import path, its JSON arguments and a small ``meta`` map
(priority, enqueue time). The producer (``EchoMQBackend``) and the worker
(``echomq.contrib.django.worker``) build the same :func:`build_app`, so both know the names.

A run returns a map (the task path, its arguments, the return value, when it started, which
worker ran it) kept as the job's result for ``RESULT_TTL_MS``: the row of a completed job is
deleted, so what ``get_result`` needs must be in the kept outcome. A task that raises is
dead-lettered at once (Django tasks are not retried) with ``last_error``
``"Discard: <exception class path>\\n<traceback>"``, which ``get_result`` turns back into a
``TaskError``.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from datetime import datetime, timezone
from typing import Any

import echomq
from echomq.contrib.django import _api
from echomq.errors import JobFailed

# The prefix of a kept error that a task raised (the Discard the runner raises).
_RAISED = "Discard: "
# What an error that is not a task's exception is reported as (an expiry, a cancel, a lost
# worker's job dead-lettered by the sweep): echomq's JobFailed, with echomq's text.
_ECHOMQ_ERROR = f"{JobFailed.__module__}.{JobFailed.__qualname__}"

DEFAULT_RESULT_TTL_MS = 24 * 3600 * 1000
DEFAULT_LEASE_MS = 60_000


def task_name(queue: str) -> str:
    """The echomq task that runs the Django tasks of ``queue``."""
    return f"django:{queue}"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def build_app(queues: list[str], options: dict[str, Any]) -> echomq.App:
    """The echomq app of a backend: one runner task per queue (``OPTIONS``: ``URL``,
    ``RESULT_TTL_MS``, ``LEASE_MS``, ``TIMEOUT``)."""
    app = echomq.App(url=options.get("URL"))
    keep = int(options.get("RESULT_TTL_MS", DEFAULT_RESULT_TTL_MS))
    for queue in queues:
        app.task(
            queue=queue,
            name=task_name(queue),
            max_attempts=1,  # a Django task that raises is FAILED, not retried
            keep_result_ms=keep,
            lease_ms=int(options.get("LEASE_MS", DEFAULT_LEASE_MS)),
            timeout=options.get("TIMEOUT"),
        )(run)
    return app


def to_datetime(ms: int | None) -> datetime | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def now_ms() -> int:
    return int(time.time() * 1000)


def run(path: str, args: list[Any], kwargs: dict[str, Any], meta: dict[str, Any]) -> Any:
    """The handler of every ``django:<queue>`` task: import the Django task by its path and
    run it as Django's own immediate backend does (signals, ``TaskContext``, JSON-normalized
    return value), with Django's database connections closed around it as a request's are."""
    from django.db import close_old_connections
    from django.utils.module_loading import import_string

    job = echomq.current_job()
    job_id = job.id if job is not None else ""
    started = now_ms()
    close_old_connections()
    try:
        task = import_string(path)
        if not isinstance(task, _api.Task):
            raise TypeError(f"{path} is not a Django task (decorate it with @task)")
        result = _api.TaskResult(
            task=task,
            id=job_id,
            status=_api.TaskResultStatus.RUNNING,
            enqueued_at=to_datetime(meta.get("enqueued_ms")),
            started_at=to_datetime(started),
            last_attempted_at=to_datetime(started),
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=task.backend,
            errors=[],
            worker_ids=[worker_id()],
        )
        _api.task_started.send(type(task.get_backend()), task_result=result)
        try:
            if task.takes_context:
                value = task.call(_api.TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = _normalize(value)
        except BaseException as exc:
            _finished(result, exc)
            raise
        _finished(result, None)
        _api.set_field(result, "_return_value", value)
    except echomq.Discard:
        raise
    except BaseException as exc:  # the task's failure: dead now, its class and traceback kept
        cls = type(exc)
        text = "".join(traceback.format_exception(exc))
        raise echomq.Discard(f"{cls.__module__}.{cls.__qualname__}\n{text}") from exc
    finally:
        close_old_connections()
    return {
        "task": path,
        "args": args,
        "kwargs": kwargs,
        "value": value,
        "meta": meta,
        "started_ms": started,
        "worker": worker_id(),
    }


def _normalize(value: Any) -> Any:
    try:  # Django 6
        from django.utils.json import normalize_json  # type: ignore[import-not-found]
    except ImportError:
        from django_tasks.utils import normalize_json
    return normalize_json(value)


def _finished(result: Any, exc: BaseException | None) -> None:
    _api.set_field(result, "finished_at", to_datetime(now_ms()))
    if exc is None:
        _api.set_field(result, "status", _api.TaskResultStatus.SUCCESSFUL)
    else:
        cls = type(exc)
        result.errors.append(
            _api.TaskError(
                exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
        )
        _api.set_field(result, "status", _api.TaskResultStatus.FAILED)
    _api.task_finished.send(type(result.task.get_backend()), task_result=result)


def task_error(text: str) -> Any:
    """The ``TaskError`` a dead job's kept error (or ``last_error``) stands for."""
    if text.startswith(_RAISED) and "\n" in text:
        path, _, tb = text[len(_RAISED) :].partition("\n")
        return _api.TaskError(exception_class_path=path, traceback=tb)
    return _api.TaskError(exception_class_path=_ECHOMQ_ERROR, traceback=text)
