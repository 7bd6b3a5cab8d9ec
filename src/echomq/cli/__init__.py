"""The ``echomq`` command line: run workers, operate queues, run a server, run the demo.

The server comes from ``--url``, else ``ECHOMQ_URL``, else an ``echomq server`` recorded in
the nearest ``.echomq/`` at or above the current directory. ``worker``, ``server`` and
``demo`` start a private embedded server when none is configured; the operator commands
default to ``redis://127.0.0.1:6379/0``.
"""

from __future__ import annotations

# The command modules register their commands on ``main`` when imported.
from echomq.cli import batch, operate, scale, serve, shards, upgrade, views, work
from echomq.cli._common import main

__all__ = ["batch", "main", "operate", "scale", "serve", "shards", "upgrade", "views", "work"]
