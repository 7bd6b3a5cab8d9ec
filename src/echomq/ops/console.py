"""Job lists, finds and bulk actions, for the dashboard and the CLI.

The operator console's job lists, finds and bulk actions (its flow trees are
``ops.flowtree``'s), shared by the
dashboard (``echomq.web``) and the CLI (``echomq browse``), so both show the same columns.

Reads are bounded: a list reads one page of a state's set by rank (O(log N) however deep
the page) and one ``HMGET`` per listed job; a find reads at most ``bound`` members of the
set, newest first, and says how many of how many it searched; the flow view walks at most
``bound_keys`` keys of the keyspace. Nothing here reads a whole set.

The bulk actions write through the public verbs, one script call per job (``reprocess``,
``remove``, ``cancel``...), so each job's move is the same atomic transition a script or the
CLI makes; a bulk action is many of them, not one transaction.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from echomq import ids
from echomq.client.executor import SyncExecutor
from echomq.errors import InvalidArgument, JobGone, StateError
from echomq.ops import snapshots as _inspect
from echomq.protocol import envelope as _envelope
from echomq.protocol import registry as _registry
from echomq.protocol.kernel import Call, Keys, _cmd, _s
from echomq.queue import Queue
from echomq.serializers import JSON, MsgPack, Serializer

__all__ = [
    "FIND_KINDS",
    "ROW_FIELDS",
    "Found",
    "JobRow",
    "bulk",
    "find",
    "human",
    "job_row",
    "one_line",
    "preview",
    "rows",
    "table",
]

# The row fields a list shows. `priority` is read whether or not the server writes it: a
# queue without priorities answers nil and the column shows a dash. `floor` makes the
# attempts column the count max_attempts compares (hand-backs and push-backs not counted).
ROW_FIELDS = (
    "payload",
    "attempts",
    "last_error",
    "priority",
    "group",
    "state",
    "parent",
    "floor",
    "cancel",
)
FIND_KINDS = ("id", "task", "error")
PREVIEW = 80  # characters of an arguments preview
_ID_PREFIX = re.compile(r"^[0-9A-Za-z]{1,14}$")
_JSON = JSON()


@functools.cache
def _msgpack() -> Serializer:
    """The shared ``MsgPack()``, built when a payload first needs it, not at import: msgpack
    is an optional extra and the CLI imports this module on a base install (issue 36).
    Without the extra, :class:`~echomq.errors.MissingExtra` (``preview`` shows the bytes)."""
    return MsgPack()


@dataclass
class JobRow:
    """One line of a job list."""

    id: str
    state: str
    exists: bool  # False: the id sat in the set without a row (a ghost, or just settled)
    task: str | None = None
    args: str = ""  # a preview of the arguments, cut to PREVIEW characters
    attempts: int = 0
    priority: str | None = None
    error: str = ""  # the last error's first line
    group: str | None = None
    parent: str | None = None
    minted_ms: int | None = None
    score_ms: int | None = None  # lease end, run-at, finish or death (by state), server ms
    worker: str | None = None  # host:pid of the worker holding it (active, from the registry)
    since_ms: int | None = None  # when that worker's beat first saw it running
    cancel: bool = False  # a cancel was asked of the running job: its worker stops it (D22)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def one_line(text: str, width: int = 160) -> str:
    """The first non-empty line of ``text`` (a traceback's last line says most: used when
    the text has several), cut to ``width`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _serializer_for(app_serializer: Serializer | None, data: bytes) -> Serializer:
    """The app's serializer when given; else the one the payload's first byte names: a JSON
    envelope starts with ``[`` or ``{``, a msgpack one with a fixarray/fixmap byte."""
    if app_serializer is not None:
        return app_serializer
    if data[:1] in (b"[", b"{"):
        return _JSON
    if data and (0x80 <= data[0] <= 0x9F or data[0] in (0xDC, 0xDD, 0xDE, 0xDF)):
        return _msgpack()
    return _JSON


def preview(
    serializer: Serializer | None, payload: bytes | str | None, width: int = PREVIEW
) -> tuple[str | None, str]:
    """``(task, arguments preview)`` of a payload: the envelope decoded by ``serializer``
    (or the one its first byte names); a payload that is no envelope is shown as text, or
    as bytes when it is not UTF-8, cut to ``width`` characters."""
    if payload is None:
        return None, ""
    data = payload.encode() if isinstance(payload, str) else payload
    try:
        task, args, kwargs = _envelope.parse(_serializer_for(serializer, data), data)
    except Exception:  # not an envelope: the bytes themselves
        try:
            return None, _cut(data.decode("utf-8"), width)
        except UnicodeDecodeError:
            return None, _cut(repr(data), width)
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return (task if isinstance(task, str) else repr(task)), _cut(", ".join(parts), width)


def _short(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bytes):
        return repr(value)
    return repr(value) if not isinstance(value, (dict, list)) else _json_text(value)


def _json_text(value: Any) -> str:
    try:
        return _s(_JSON.dumps(value))
    except Exception:
        return repr(value)


def _held(workers: Iterable[_registry.WorkerInfo]) -> dict[str, tuple[str, int]]:
    """Job id -> (``host:pid`` of the worker holding it, since when), from the registry."""
    out: dict[str, tuple[str, int]] = {}
    for w in workers:
        for j in w.jobs:
            out[j.id] = (f"{w.host}:{w.pid}", j.since_ms)
    return out


def _row_call(k: Keys, job_id: str) -> Call[list[Any]]:
    return _cmd(("HMGET", k.job(job_id), *ROW_FIELDS), list)


def rows(
    x: SyncExecutor,
    k: Keys,
    items: Sequence[tuple[str, int | None]],
    state: str,
    *,
    serializer: Serializer | None = None,
    with_workers: bool | None = None,
) -> list[JobRow]:
    """The list rows of ``items`` (ids with their set scores) of ``state``: one pipeline of
    ``HMGET`` (and the worker registry when the state is ``active``)."""
    want_workers = state == "active" if with_workers is None else with_workers
    calls: list[Call[Any]] = [_row_call(k, job_id) for job_id, _ in items]
    if want_workers:
        calls.append(_registry.list_workers(k))
    replies = [_inspect._raise(r) for r in x.pipeline(calls)] if calls else []
    held = _held(replies.pop()) if want_workers else {}
    out = []
    for (job_id, score), values in zip(items, replies, strict=True):
        out.append(_row(job_id, state, score, values, serializer, held))
    return out


def _counted(attempts: Any, floor: Any) -> int:
    """The attempts max_attempts counts: the row's attempts less its floor (a shutdown's
    hand-back, a RateLimit push-back, an earlier incarnation's claims), as Job.attempt."""
    if attempts is None:
        return 0
    return int(_s(attempts)) - (int(_s(floor)) if floor is not None else 0)


def job_row(
    x: SyncExecutor, k: Keys, job_id: str, place: str, *, serializer: Serializer | None = None
) -> JobRow:
    """One job's list row, as its place's list shows it: its set's score (lease end, run
    time, death, finish) and, when it is active, the worker holding it (a job page's
    summary)."""
    state = "schedule" if place == "scheduled" else place
    key = _set_key(k, state, None) if state in ("active", "schedule", "dead", "completed") else None
    score = None
    if key is not None:
        raw = _inspect._raise(x.pipeline([_cmd(("ZSCORE", key, job_id), lambda r: r)])[0])
        score = int(float(_s(raw))) if raw is not None else None
    return rows(x, k, [(job_id, score)], state, serializer=serializer)[0]


def _row(
    job_id: str,
    state: str,
    score: int | None,
    values: list[Any],
    serializer: Serializer | None,
    held: dict[str, tuple[str, int]],
) -> JobRow:
    payload, attempts, error, priority, group, row_state, parent, floor, cancel = values
    try:
        minted: int | None = ids.decode_time_ms(job_id)
    except ValueError:
        minted = None
    row = JobRow(job_id, state, exists=row_state is not None, minted_ms=minted, score_ms=score)
    if row_state is None:
        return row
    row.state = _s(row_state)
    row.task, row.args = preview(serializer, payload)
    row.attempts = _counted(attempts, floor)
    row.priority = _s(priority) if priority is not None else None
    row.error = one_line(_s(error)) if error is not None else ""
    row.group = _s(group) if group is not None else None
    row.parent = _s(parent) if parent is not None else None
    row.cancel = cancel is not None
    if job_id in held:
        row.worker, row.since_ms = held[job_id]
        if minted is not None and row.since_ms < minted:
            # A run cannot start before its job was enqueued: a registry "since" before the
            # id's time is a clock apart (the producer's vs the server's) or an entry written
            # from a stale clock; the list must not show "running" longer than "age".
            row.since_ms = minted
    return row


@dataclass
class Found:
    """The answer of a bounded find: the matches, and how much of the set was searched."""

    kind: str
    text: str
    state: str
    rows: list[JobRow]
    searched: int
    total: int
    capped: bool  # stopped at the match limit before the bound

    @property
    def complete(self) -> bool:
        return self.searched >= self.total and not self.capped

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "text": self.text,
            "state": self.state,
            "rows": [r.as_dict() for r in self.rows],
            "searched": self.searched,
            "total": self.total,
            "complete": self.complete,
        }


def _check_find(kind: str, text: str) -> str:
    if kind not in FIND_KINDS:
        raise InvalidArgument(f"find by one of {', '.join(FIND_KINDS)}, got {kind!r}")
    text = text.strip()
    if not text or len(text) > 200:
        raise InvalidArgument("a find needs 1 to 200 characters")
    if kind == "id" and not _ID_PREFIX.match(text):
        raise InvalidArgument(f"an id (or its prefix) is 1-14 letters and digits, got {text!r}")
    return text


def find(
    x: SyncExecutor,
    k: Keys,
    state: str,
    kind: str,
    text: str,
    *,
    serializer: Serializer | None = None,
    group: str | None = None,
    bound: int = 10_000,
    limit: int = 100,
    chunk: int = 500,
) -> Found:
    """Jobs of ``state`` whose id starts with ``text`` (``kind="id"``), whose task name
    contains it (``"task"``) or whose last error does (``"error"``, case-insensitive), among
    the newest ``bound`` members of the set; at most ``limit`` matches.

    An id prefix in a set of one score (pending or a lane without priorities) is a ``BYLEX``
    range: exact over the whole set, however large."""
    text = _check_find(kind, text)
    page0 = _inspect.page(x, k, state, 0, 1, group)  # validates state and lane, reads ZCARD
    key = _set_key(k, page0.state, group)
    total = page0.total
    if kind == "id" and _one_score(x, key):
        args = ("ZRANGE", key, "(" + text + "~", "[" + text, "BYLEX", "REV", "LIMIT", 0, limit)
        got = [_s(m) for m in _inspect._raise(x.pipeline([_cmd(args, list)])[0])]
        found = rows(x, k, [(m, None) for m in got], page0.state, serializer=serializer)
        return Found(kind, text, page0.state, found, total, total, len(got) >= limit)
    matches: list[JobRow] = []
    searched = 0
    needle = text.lower()
    while searched < min(bound, total) and len(matches) < limit:
        n = min(chunk, bound - searched)
        part = _inspect.page(x, k, page0.state, searched, n, group)
        if not part.items:
            break
        searched += len(part.items)
        for row in rows(x, k, part.items, page0.state, serializer=serializer):
            if _matches(row, kind, text, needle):
                matches.append(row)
    capped = len(matches) >= limit
    return Found(kind, text, page0.state, matches[:limit], searched, total, capped)


def _one_score(x: SyncExecutor, key: str) -> bool:
    """Whether every member of ``key`` has the same score (its first and last do): only then
    does the set's order by member hold, and a ``BYLEX`` range is exact. A waiting set does
    while no job in it has a priority; a timed set (dead, by the time of death) rarely."""
    ends = [_cmd(("ZRANGE", key, i, i, "WITHSCORES"), list) for i in (0, -1)]
    first, last = (_inspect._raise(r) for r in x.pipeline(ends))
    return not first or _inspect._first_score(first) == _inspect._first_score(last)


def _set_key(k: Keys, state: str, group: str | None) -> str:
    if group is not None:
        return k.lane(group)
    sets = {"pending": k.pending, "dead": k.dead, "active": k.active, "schedule": k.schedule}
    return sets.get(state, k.completed)


def _matches(row: JobRow, kind: str, text: str, needle: str) -> bool:
    if kind == "id":
        return row.id.startswith(text)
    if kind == "task":
        return row.task is not None and needle in row.task.lower()
    return needle in row.error.lower()


def human(delta_ms: float) -> str:
    """A duration as a person reads it: 4.2s, 3.5m, 2.0h."""
    d = abs(delta_ms) / 1000
    return f"{d:.1f}s" if d < 120 else f"{d / 60:.1f}m" if d < 7200 else f"{d / 3600:.1f}h"


def table(rows: Sequence[JobRow], state: str, now_ms: int, *, width: int = 30) -> list[str]:
    """A job list as aligned text lines (``echomq browse``): the dashboard's columns, the
    arguments and the error cut to ``width`` characters."""
    head = ["id", "task", "args", "attempts", "priority", "error", "age"]
    if state == "active":
        head += ["worker", "running", "lease"]
    elif state == "schedule":
        head += ["runs"]
    elif state == "completed":
        head += ["finished"]
    elif state == "dead":
        head += ["died"]
    lines = [head]
    for r in rows:
        age = human(now_ms - r.minted_ms) if r.minted_ms is not None else "-"
        cells = [
            r.id,
            r.task or "-",
            _cut(r.args, width) or "-",
            str(r.attempts),
            r.priority or "-",
            _cut(r.error, width) or "-",
            age,
        ]
        if state == "active":
            running = human(now_ms - r.since_ms) if r.since_ms is not None else "-"
            lease = "in " + human(r.score_ms - now_ms) if r.score_ms is not None else "-"
            cells += [r.worker or "-", running, lease]
        elif state == "schedule":
            due = r.score_ms is not None and r.score_ms <= now_ms
            when = "due" if due or r.score_ms is None else "in " + human(r.score_ms - now_ms)
            cells += [when]
        elif state in ("completed", "dead"):
            ago = human(now_ms - r.score_ms) + " ago" if r.score_ms is not None else "-"
            cells += [ago]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    numeric = {3, 4}  # attempts, priority: right-aligned
    return [
        "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    ]


# --------------------------------------------------------------------------- bulk actions


def _each(fn: Callable[[str], Any], job_ids: Iterable[str]) -> tuple[int, list[str]]:
    """``fn`` on each id; the count it moved and the ids refused (gone or in another state
    by now: a list is a snapshot, another operator or a worker may have moved them)."""
    done = 0
    refused: list[str] = []
    for job_id in job_ids:
        try:
            fn(job_id)
        except (JobGone, StateError):
            refused.append(job_id)
            continue
        done += 1
    return done, refused


def _whole_set(q: Queue, state: str, fn: Callable[[str], Any]) -> tuple[int, int]:
    """``fn`` on every job of ``state``, 1000 at a time, each job once: a job that comes
    back into the set while the loop runs (reprocessed and dead again) is not taken twice,
    so the loop ends. The counts moved and skipped (moved meanwhile, or gone)."""
    seen: set[str] = set()
    moved = skipped = 0
    while batch := [j for j in q.browse(state, 1000) if j not in seen]:
        seen.update(batch)
        done, refused = _each(fn, batch)
        moved += done
        skipped += len(refused)
    return moved, skipped


def bulk(
    q: Queue, verb: str, job_ids: Sequence[str] | None = None, *, seen: str | None = None
) -> dict[str, int]:
    """A bulk action: ``verb`` (``reprocess``, ``remove``, ``cancel``, ``run_now``) on the
    listed ids, or, with ``job_ids=None``, ``reprocess`` or ``remove`` on every dead job.
    ``seen``: the state the page showed them in (the whole set's is ``dead``): a remove or
    cancel skips, in its script, a job that has moved since (issue 37). Returns
    ``{"done": moved, "skipped": left alone (moved meanwhile, or gone)}``."""
    if job_ids is None:
        seen = "dead"

    def cancel(job_id: str) -> None:
        if q.cancel(job_id, if_state=seen) == "absent":
            raise JobGone(job_id)

    def remove(job_id: str) -> None:
        q.remove(job_id, if_state=seen)

    fns: dict[str, Callable[[str], Any]] = {
        "reprocess": q.reprocess,
        "remove": remove,
        "cancel": cancel,
        "run_now": q.run_now,
    }
    if verb not in fns:
        raise InvalidArgument(f"no bulk {verb!r}: one of {', '.join(fns)}")
    if job_ids is None:
        if verb not in ("reprocess", "remove"):
            raise InvalidArgument(f"{verb} applies to a selection, not to a whole set")
        done, skipped = _whole_set(q, "dead", fns[verb])
    else:
        done, refused = _each(fns[verb], job_ids)
        skipped = len(refused)
    return {"done": done, "skipped": skipped}
