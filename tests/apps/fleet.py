"""apps.basic's tasks, for ``echomq worker -p N`` tests; with ``EMQ_TEST_CRASH=<status>`` every
worker process the supervisor starts exits at once with that status (a crash loop), while
the supervisor itself imports the app fine."""

from __future__ import annotations

import os

from apps.basic import app

__all__ = ["app"]

if os.environ.get("EMQ_TEST_CRASH"):
    _status = int(os.environ["EMQ_TEST_CRASH"])
    if os.environ.get("ECHOMQ_CHILD_INDEX"):  # a spawned child imports the app itself
        os._exit(_status)
    os.register_at_fork(after_in_child=lambda: os._exit(_status))
