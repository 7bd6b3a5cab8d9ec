"""An app whose jobs kill their worker process, for the supervisor's restart policy (issue 39):

- ``EMQ_TEST_QUEUE``: the queue of its task (required).
- ``EMQ_TEST_BREAK_CHILDREN``: set, the module fails to import in a supervised child (one
  that has ``ECHOMQ_CHILD_INDEX``), as a broken deploy does, while the supervisor imports it.

Task ``crash(marker, how)`` writes its process id to the file ``marker``, then ends its
process: ``os._exit(1)`` (``how="exit"``) or SIGKILL (``how="kill"``), as the OOM killer
does to a busy child.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from echomq import App

QUEUE = os.environ.get("EMQ_TEST_QUEUE", "unset")

if os.environ.get("EMQ_TEST_BREAK_CHILDREN") and os.environ.get("ECHOMQ_CHILD_INDEX"):
    raise ImportError("a module the supervised children cannot import (the test's broken deploy)")

app = App()


@app.task(queue=QUEUE, name="crash", lease_ms=600_000, max_attempts=1)
def crash(marker: str, how: str) -> None:
    Path(marker).write_text(str(os.getpid()))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)
