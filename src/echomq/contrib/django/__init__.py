"""A backend for Django's task framework (extra ``django``).

A backend for Django's task framework (``django.tasks`` on Django >= 6.0, or the
``django-tasks`` backport on Django 5.2) that runs Django tasks as echomq jobs: extra
``echomq[django]``, guide docs/guides/django.md.

In settings::

    TASKS = {
        "default": {
            "BACKEND": "echomq.contrib.django.backend.EchoMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"URL": "redis://127.0.0.1:6379/0"},
        }
    }

and run the tasks with ``echomq worker echomq.contrib.django.worker:app`` (with
``DJANGO_SETTINGS_MODULE`` set). Without Django (or, on Django < 6, the backport),
importing this package raises ``MissingExtra`` naming the extra.
"""

from __future__ import annotations

# Importing the package checks the extra (MissingExtra without Django); the backend is
# ``echomq.contrib.django.backend.EchoMQBackend``, the worker app ``...worker:app``.
from echomq.contrib.django._api import SOURCE

__all__ = ["SOURCE"]
