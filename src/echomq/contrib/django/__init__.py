"""A backend for Django's task framework (``django.tasks`` on Django >= 6.0, or the
``django-tasks`` backport on Django 5.2) that runs Django tasks as echomq jobs: extra
``echomq[django]``, guide docs/guides/django.md.

In settings::

    TASKS = {
        "default": {
            "BACKEND": "echomq.contrib.django.EchoMQBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"URL": "redis://127.0.0.1:6379/0"},
        }
    }

and run the tasks with ``echomq worker echomq.contrib.django.worker:app`` (with
``DJANGO_SETTINGS_MODULE`` set). Without Django (or, on Django < 6, the backport),
importing this package raises ``MissingExtra`` naming the extra.
"""

from __future__ import annotations

from echomq.contrib.django._api import SOURCE
from echomq.contrib.django.backend import PRIORITY_OFFSET, EchoMQBackend, echomq_priority

__all__ = ["PRIORITY_OFFSET", "SOURCE", "EchoMQBackend", "echomq_priority"]
