"""The echomq app that runs Django tasks: ``echomq worker echomq.contrib.django.worker:app``.

Importing it sets Django up (``DJANGO_SETTINGS_MODULE`` must name the project's settings, as
for ``manage.py``) and builds the app of the task backend named by ``ECHOMQ_DJANGO_BACKEND``
(default ``"default"``, an ``EchoMQBackend`` in ``settings.TASKS``): one echomq task per
queue of its ``QUEUES``, which runs each Django task by its import path. ``--queue`` narrows
the queues served, as for any app.
"""

from __future__ import annotations

import os

import echomq
from echomq.contrib.django import _api
from echomq.contrib.django.backend import EchoMQBackend

BACKEND_ENV = "ECHOMQ_DJANGO_BACKEND"


def app_for(alias: str) -> echomq.App:
    """The echomq app of the task backend ``alias`` (an ``EchoMQBackend``)."""
    import django

    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        from django.conf import settings

        if not settings.configured:
            raise echomq.InvalidArgument(
                "echomq.contrib.django.worker: set DJANGO_SETTINGS_MODULE to the project's "
                "settings (as for manage.py)"
            )
    django.setup()
    if _api.SOURCE == "django.tasks":
        from django.tasks import task_backends
    else:
        from django_tasks import task_backends  # type: ignore[no-redef]
    backend = task_backends[alias]
    if not isinstance(backend, EchoMQBackend):
        raise echomq.InvalidArgument(
            f"TASKS[{alias!r}] is {type(backend).__name__}, not echomq's EchoMQBackend"
        )
    return backend.app


app = app_for(os.environ.get(BACKEND_ENV, "default"))
