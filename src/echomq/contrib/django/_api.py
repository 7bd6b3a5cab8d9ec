"""Django's task framework: ``django.tasks`` or the ``django_tasks`` backport.

Django's task framework, wherever it comes from: ``django.tasks`` (Django >= 6.0, Python
>= 3.12) when present, else the backport ``django_tasks`` (PyPI ``django-tasks``, Django
5.2 on Python 3.10+). The two have the same classes and behaviour; only the module path and
the name of the invalid-task error differ, so the rest of ``echomq.contrib.django`` imports
them from here and runs unchanged on either.
"""

from __future__ import annotations

from typing import Any

from echomq.protocol import extras as _extras

try:
    import django  # noqa: F401  (a missing Django names the extra, like the backport's)
except ImportError as exc:
    raise _extras.missing("django", "the Django task backend (echomq.contrib.django)", exc) from exc

try:  # Django >= 6.0
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
except ImportError:
    try:  # the backport, for Django 5.2 / Python 3.11
        from django_tasks import (  # type: ignore[no-redef]
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import Task, TaskError  # type: ignore[no-redef]
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskError,
            TaskResultDoesNotExist,
        )
        from django_tasks.signals import (  # type: ignore[no-redef]
            task_enqueued,
            task_finished,
            task_started,
        )
    except ImportError as exc:
        raise _extras.missing(
            "django", "the Django task backend (echomq.contrib.django)", exc, "django_tasks"
        ) from exc
    SOURCE = "django_tasks"

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTaskError",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultStatus",
    "TaskResultDoesNotExist",
    "set_field",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def set_field(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen ``TaskResult`` (``status``, ``_return_value``...), as Django's
    own backends do."""
    object.__setattr__(result, name, value)
