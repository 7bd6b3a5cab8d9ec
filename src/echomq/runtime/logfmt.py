"""Log formats of ``echomq worker --log-format``: the text line, or one JSON object per line.

The worker passes the structured fields of a job line with ``extra=`` (``queue``, ``job_id``,
``task``, ``attempt``, ``max_attempts``, ``delay_ms``, ``duration_ms``, ``error``); the JSON
formatter writes ``ts``, ``level``, ``logger``, ``msg``, every such field present, and
``exc`` (the formatted traceback) when the line carries one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from datetime import datetime, timezone
from typing import Any

from echomq.errors import InvalidArgument

__all__ = [
    "TEXT_FORMAT",
    "JsonFormatter",
    "formatter",
    "repeats_reset",
    "stop_line",
    "warn_repeated",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"

# The attributes every LogRecord has: whatever else a record carries came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",  # 3.12+
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``msg``,
    the record's ``extra=`` fields, and ``exc`` when it has ``exc_info``. A value JSON cannot
    carry is written as its ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, timezone.utc)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(kind: str) -> logging.Formatter:
    """The formatter of ``--log-format`` ``kind`` (``text`` or ``json``)."""
    if kind == "json":
        return JsonFormatter()
    if kind == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise InvalidArgument(f"log format must be 'text' or 'json', got {kind!r}")


# Repeats of one warning (an outage makes every loop of every queue warn several times a
# second): the first is written, then at most one per _REPEAT_EVERY_S, saying how many it
# held back. Keyed by the caller (the warning and its queue); cleared when the server is back.
_REPEAT_EVERY_S = 10.0
_repeats: dict[str, tuple[float, int]] = {}
_repeats_lock = threading.Lock()


def warn_repeated(log: logging.Logger, key: str, msg: str, *args: Any) -> None:
    """``log.warning(msg, *args)``, rate-limited per ``key`` (see above)."""
    now = time.monotonic()
    with _repeats_lock:
        last, held = _repeats.get(key, (0.0, -1))
        if held >= 0 and now - last < _REPEAT_EVERY_S:
            _repeats[key] = (last, held + 1)
            return
        _repeats[key] = (now, 0)
    if held > 0:
        msg += f" ({held} more like it in the last {now - last:.0f} s)"
    log.warning(msg, *args)


def repeats_reset(prefix: str = "") -> None:
    """Forget the repeats of keys starting with ``prefix``: the next one is written at once."""
    with _repeats_lock:
        for key in [k for k in _repeats if k.startswith(prefix)]:
            del _repeats[key]


def stop_line(pid: int, stats: Any, seconds: float) -> str:
    """The worker's last line, for a person: what it got done and in how long, e.g.
    ``worker 4242 stopped: 1,234 jobs done, 2 failed, 3 handed back in 1.2 s``; then every
    counter (``name=value``), the same ones the JSON line carries as fields."""
    failed = stats.retried + stats.dead
    line = (
        f"worker {pid} stopped: {stats.completed:,} job{'' if stats.completed == 1 else 's'} "
        f"done, {failed:,} failed, "
        f"{stats.handed_back:,} handed back in {seconds:.1f} s"
    )
    counters = ", ".join(f"{f.name}={getattr(stats, f.name)}" for f in dataclasses.fields(stats))
    return f"{line} (counters: {counters})"


def log_startup(
    log: logging.Logger,
    app: Any,
    queues: list[str],
    concurrency: int,
    url: str,
    executor: str = "lua",
) -> None:
    """The worker's first lines: who serves what, where (``url`` already masked), which
    executor runs the transitions (decided at the first fence), and each queue's tasks."""
    log.info(
        "worker %d serving %s with concurrency %d on %s (executor %s)",
        os.getpid(), ", ".join(queues), concurrency, url, executor,
        extra={"url": url, "concurrency": concurrency, "executor": executor},
    )  # fmt: skip
    for name in queues:
        tasks = sorted(t.name for t in app.tasks.values() if t.queue == name)
        if tasks:
            log.info(
                "queue %s: tasks %s", name, ", ".join(tasks),
                extra={"queue": name, "tasks": tasks},
            )  # fmt: skip
        else:  # a typo in -q: every job there would be dead-lettered as an unknown task
            known = sorted({t.queue for t in app.tasks.values()})
            log.warning(
                "queue %s: no task of the app is on it (its queues: %s); a job there is "
                "dead-lettered as an unknown task", name, ", ".join(known) or "none",
                extra={"queue": name, "tasks": tasks},
            )  # fmt: skip
        repeats = sorted(
            (p for (q, _), p in getattr(app, "periodics", {}).items() if q == name),
            key=lambda p: p.name,
        )
        if repeats:
            shown = [
                f"{p.name} ({f'every {p.every_ms} ms' if p.every_ms else f'cron {p.cron!r} {p.tz}'}"
                f", task {p.task.name})"
                for p in repeats
            ]
            log.info(
                "queue %s: repeats %s", name, ", ".join(shown),
                extra={"queue": name, "repeats": [p.name for p in repeats]},
            )  # fmt: skip
