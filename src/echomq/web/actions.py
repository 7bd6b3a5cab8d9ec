"""The dashboard's actions: one per verb on a job, and the queue-wide ones.

The dashboard's actions: one :class:`JobAction` per verb on one job (the job page, a list's
row buttons and a selection are all drawn from :data:`JOB_TABLE`), and the queue-wide ones
(:data:`QUEUE_ACTIONS`). Each runs one script verb; the destructive ones ask first."""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    JobGone,
    StateError,
)
from echomq.ops import console as _console
from echomq.protocol import envelope as _envelope
from echomq.web._session import MAX_FORM

QUEUE_ACTIONS = (
    "pause",
    "resume",
    "drain",
    "pause_lane",
    "resume_lane",
    "limit_lane",
    "weight_lane",
    "retry_dead",
    "delete_dead",
    "cancel_all",
    "selected",
    "unrepeat",
    "pause_repeat",
    "resume_repeat",
)


@dataclass(frozen=True)
class JobAction:
    """One action on one job: the verb it runs, the places it applies to (as ``job_state``
    names them), its button, and whether it asks for confirmation first. The job page, the
    list's row buttons and the selection's verbs are all drawn from :data:`JOB_TABLE`, so a
    new verb is one entry here."""

    name: str
    label: str
    places: tuple[str, ...]
    destructive: bool
    # (queue, job id, the form's fields, the dashboard's App or None) -> the verb's result
    run: Callable[[Any, str, dict[str, str], Any], Any]
    field: str | None = None  # a form input the verb reads (its name), shown beside the button
    kind: str = "input"  # "textarea": a multi-line field, drawn with the payload it replaces
    hint: str | None = None  # the field's placeholder (its name when None)


def _priority(f: dict[str, str]) -> int:
    raw = f.get("priority", "").strip()
    if not raw.isdigit():
        raise InvalidArgument(f"a priority is an int 0..2097152, got {raw[:40]!r}")
    return int(raw)  # its range is the verb's to check (InvalidArgument past it)


def _seen(f: dict[str, str]) -> tuple[str | None, int | None]:
    """The state (and attempts) the page showed the job in, from its form's hidden fields
    ``seen_state`` / ``seen_attempts``: a remove or cancel skips, in its script, a job that
    has moved since the page was drawn (issue 37). Absent (a script's own POST): no check."""
    state = f.get("seen_state", "").strip() or None
    raw = f.get("seen_attempts", "").strip()
    if raw and not raw.isdigit():
        raise InvalidArgument(f"seen_attempts is an int, got {raw[:40]!r}")
    return state, (int(raw) if raw and state else None)


def _cancel(q: Any, job_id: str, f: dict[str, str], _app: Any) -> dict[str, Any]:
    state, attempts = _seen(f)
    try:
        outcome: str = q.cancel(job_id, if_state=state, if_attempts=attempts)
    except StateError:  # moved since the page was drawn: left alone
        return {"done": 0, "skipped": 1}
    if outcome == "absent":
        raise JobGone(job_id)
    return {"done": 1, "skipped": 0, "outcome": outcome}


def _remove(q: Any, job_id: str, f: dict[str, str], _app: Any) -> dict[str, int]:
    state, attempts = _seen(f)
    try:
        q.remove(job_id, if_state=state, if_attempts=attempts)
    except StateError:  # moved since the page was drawn: left alone
        return {"done": 0, "skipped": 1}
    return {"done": 1, "skipped": 0}


_SECONDS = re.compile(r"\d{1,10}(\.\d{1,3})?")


def _delay_ms(f: dict[str, str]) -> int:
    """The reschedule form's ``delay_s``: seconds from now (server clock), up to three
    decimals, as ms; InvalidArgument for anything else (its range is the verb's to check)."""
    raw = f.get("delay_s", "").strip()
    if not _SECONDS.fullmatch(raw):
        raise InvalidArgument(f"a delay is seconds from now (e.g. 90 or 1.5), got {raw[:40]!r}")
    return int(decimal.Decimal(raw) * 1000)


def _update_payload(q: Any, job_id: str, f: dict[str, str], app: Any) -> None:
    """The edit-payload form: the text as the job page shows it. With an App, a job whose
    payload is a task envelope shows it decoded (``{"task", "args", "kwargs"}`` as JSON):
    that JSON is read back and encoded by the app's serializer as a task call, keeping the
    envelope's trace context and per-job options; every other payload (and every payload
    without an App) is replaced by the text's UTF-8 bytes (line ends as LF). Bad JSON, a
    wrong shape or a text over MAX_FORM bytes is InvalidArgument, nothing written."""
    if "payload" not in f:
        raise InvalidArgument("update_payload needs the form's payload")
    text = f["payload"].replace("\r\n", "\n")
    data = text.encode("utf-8")
    if len(data) > MAX_FORM:
        raise InvalidArgument(f"a payload from the form is at most {MAX_FORM} bytes")
    serializer = getattr(app, "serializer", None)
    if serializer is not None:
        row = q.get_job(job_id)
        if row is None:
            raise JobGone(job_id)
        current = row.get("payload") or b""
        current = current.encode() if isinstance(current, str) else current
        try:
            opts = _envelope.parse_full(serializer, current)[3]
        except Exception:  # not an envelope: shown and replaced as text
            opts = None
        if opts is not None:
            tc = _envelope.trace_context(serializer, current)
            data = _task_call(serializer, text, tc, opts)
    q.update_payload(job_id, data)


def _task_call(serializer: Any, text: str, tc: dict[str, str], opts: dict[str, Any]) -> bytes:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"the payload is not JSON: {exc}") from None
    shape = 'a JSON object {"task": "name", "args": [...], "kwargs": {...}}'
    if not isinstance(value, dict) or set(value) - {"task", "args", "kwargs"}:
        raise InvalidArgument(f"a task call is {shape}")
    task, args, kwargs = value.get("task"), value.get("args", []), value.get("kwargs", {})
    if not isinstance(task, str) or not task:
        raise InvalidArgument(f"a task call names its task: {shape}")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidArgument(f"a task call's args is a list and its kwargs an object: {shape}")
    try:
        return _envelope.build(serializer, task, args, kwargs, tc=tc or None, opts=opts or None)
    except Exception as exc:  # the serializer refused a value
        raise InvalidArgument(f"the app's serializer cannot encode it: {exc}") from None


JOB_TABLE: dict[str, JobAction] = {
    a.name: a
    for a in (
        JobAction(
            "reprocess",
            "reprocess",
            ("dead", "completed"),
            False,
            lambda q, i, f, a: q.reprocess(i),
        ),
        JobAction("retry", "run now", ("scheduled",), False, lambda q, i, f, a: q.run_now(i)),
        JobAction(
            "reschedule",
            "reschedule",
            ("scheduled",),
            False,
            lambda q, i, f, a: q.reschedule(i, _delay_ms(f)),
            field="delay_s",
            hint="seconds from now",
        ),
        JobAction(
            "change_priority",
            "set priority",
            ("pending", "scheduled"),
            False,
            lambda q, i, f, a: q.change_priority(i, _priority(f)),
            field="priority",
        ),
        JobAction(
            "update_payload",
            "save payload",
            ("pending", "scheduled"),
            False,
            _update_payload,
            field="payload",
            kind="textarea",
        ),
        JobAction("cancel", "cancel", ("active",), True, _cancel),
        JobAction(
            "remove",
            "remove",
            ("pending", "scheduled", "dead", "active", "awaiting_children", "completed"),
            True,
            _remove,
        ),
    )
}


JOB_ACTIONS = tuple(JOB_TABLE)


# The verbs a list's selection can apply (the names of `ops.console.bulk`), the harmless ones
# first; the list's select starts on none of them (a destructive pick is an explicit one).
SELECTION = {"reprocess": "reprocess", "retry": "run_now", "cancel": "cancel", "remove": "remove"}


ACTIONS = QUEUE_ACTIONS


DESTRUCTIVE = {"drain", "delete_dead", "cancel_all", "unrepeat"} | {
    a.name for a in JOB_TABLE.values() if a.destructive
}


def _counts(result: Any, asked: int | None) -> tuple[int, int]:
    """(done, skipped) of a bulk action's result: ``{"done", "skipped"}`` (issue 37), or a
    bare count of what was done, the rest of ``asked`` skipped."""
    if isinstance(result, dict):
        return int(result.get("done", 0)), int(result.get("skipped", 0))
    done = int(result or 0)
    return done, (asked - done if asked is not None else 0)


def _jobs(n: int) -> str:
    return f"{n:,} job" + ("" if n == 1 else "s")


# What a selection's verb did, as the flash message says it ({} is "N jobs").
_DID = {
    "reprocess": "reprocessed {}",
    "retry": "moved {} to waiting (run now)",
    "cancel": "cancelled {}",
    "remove": "removed {}",
}


def describe(
    action: str, job_id: str | None, f: dict[str, str], selected: list[str], result: Any
) -> str:
    """The flash message a page shows after ``action`` ran (its JSON twin returns
    ``result`` itself): what was done, and what was skipped, in words."""
    if job_id is not None:
        job = f"job {job_id}"
        if isinstance(result, dict) and result.get("skipped"):
            # A remove or cancel whose job moved since the page was drawn (issue 37).
            return f"{job} was left alone: it moved since the page was drawn"
        if isinstance(result, dict):
            result = result.get("outcome")
        said = {
            "reprocess": f"{job} sent back to waiting",
            "retry": f"{job} is waiting now",
            "reschedule": f"{job} rescheduled in {f.get('delay_s', '').strip()} s",
            "change_priority": f"{job}: priority set to {f.get('priority', '').strip()}",
            "update_payload": f"{job}: payload saved",
            "remove": f"removed {job}",
            "cancel": (
                f"{job}: cancel requested; its worker stops it and dead-letters it"
                if result == "signalled"
                else f"{job} cancelled (it was not running: removed)"
            ),
        }
        return said.get(action, f"{action.replace('_', ' ')}: done")
    lane = f.get("lane", "")
    name = f.get("name", "")
    if action == "selected":
        verb = f.get("verb", "")
        moved, skipped = _counts(result, len(selected))
        text = _DID.get(verb, verb + " {}").format(_jobs(moved))
        return text + (
            f", skipped {skipped:,} (gone or moved since the list was read)" if skipped else ""
        )
    if action == "retry_dead":
        return f"sent {_jobs(int(result or 0))} from dead back to waiting"
    if action == "delete_dead":
        done, skipped = _counts(result, None)
        return f"deleted {_jobs(done)} from dead" + (
            f", skipped {skipped:,} (moved since the list was read)" if skipped else ""
        )
    if action == "cancel_all":
        got = result if isinstance(result, dict) else {}
        return (
            f"removed {_jobs(int(got.get('removed', 0)))} waiting or scheduled; "
            f"asked {_jobs(int(got.get('signalled', 0)))} running to stop"
        )
    if action == "drain":
        return f"drained: deleted {_jobs(int(result or 0))} waiting"
    if action in ("pause", "resume"):
        what = f"lane {lane}" if lane else "the queue"
        return f"{action}d {what}"
    if action in ("pause_lane", "resume_lane"):
        return f"{action.partition('_')[0]}d lane {lane}"
    if action == "limit_lane":
        value = f.get("value", "").strip()
        return f"lane {lane}: " + (
            f"at most {value} at once" if value not in ("", "none") else "no limit"
        )
    if action == "weight_lane":
        return f"lane {lane}: weight {f.get('value', '').strip()}"
    if action == "unrepeat":
        return f"removed repeat {name}" if result else f"no repeat named {name}: nothing removed"
    if action in ("pause_repeat", "resume_repeat"):
        return f"{action.partition('_')[0]}d repeat {name}"
    return f"{action.replace('_', ' ')}: done"


class _NoSuchRepeat(EchoMQError):
    """A pause or resume of a repeat name not registered on the queue: 404."""


def perform(
    client: Any,
    app: Any,
    queue: str,
    job_id: str | None,
    action: str,
    f: dict[str, str],
    selected: list[str],
) -> Any:
    """Run one checked action (a job's, from :data:`JOB_TABLE`, or a queue's, from
    :data:`QUEUE_ACTIONS`) on ``queue``, on the dashboard's ``client``; ``app`` encodes an
    edited task call. A malformed id or name raises before anything is written."""
    from echomq.queue import Queue

    q = Queue(queue, client=client, retry_for=0)
    n = len(q.shards())
    if n > 1:  # a sharded queue (issue 43): its actions act on every shard, by id on the job's
        q = Queue(queue, client=client, retry_for=0, shards=n)
    if job_id is not None:
        q._k.job(job_id)  # a malformed id is InvalidId (400) before the verb runs
        return JOB_TABLE[action].run(q, job_id, f, app)
    lane = f.get("lane") or None
    if action == "retry_dead":
        return q.reprocess_all("dead")
    if action == "delete_dead":
        return _console.bulk(q, "remove")
    if action == "cancel_all":
        return q.cancel_all()
    if action == "selected":
        verb = f.get("verb", "")
        if not verb:
            raise InvalidArgument("choose what to do with the selected jobs")
        if verb not in SELECTION:
            raise InvalidArgument(f"a selection's verb is one of {', '.join(SELECTION)}")
        if not selected or len(selected) > 1000:
            raise InvalidArgument("select 1 to 1000 jobs")
        for one in selected:
            q._k.job(one)  # every id checked before the first one moves
        return _console.bulk(q, SELECTION[verb], selected, seen=_seen(f)[0])
    if action == "unrepeat":
        return q.unrepeat(f.get("name", ""))
    if action in ("pause_repeat", "resume_repeat"):
        name = f.get("name", "")
        flip = q.pause_repeat if action == "pause_repeat" else q.resume_repeat
        if not flip(name):  # a malformed name is InvalidArgument (400) first
            raise _NoSuchRepeat(f"no such repeat: {name!r}")
        return True
    if action == "pause":
        q.pause_lane(lane) if lane else q.pause()
    elif action == "resume":
        q.resume_lane(lane) if lane else q.resume()
    elif action == "drain":
        return q.drain(include_scheduled=f.get("include_schedule") == "1")
    elif action in ("pause_lane", "resume_lane", "limit_lane", "weight_lane"):
        if not lane:
            raise InvalidArgument(f"{action} needs a lane")
        if action == "pause_lane":
            q.pause_lane(lane)
        elif action == "resume_lane":
            q.resume_lane(lane)
        else:
            raw = f.get("value", "").strip()
            if action == "limit_lane" and raw in ("", "none"):
                q.limit_lane(lane, None)
            else:
                try:
                    value = int(raw)
                except ValueError:
                    raise InvalidArgument(f"{action} needs an int value, got {raw!r}") from None
                if action == "limit_lane":
                    q.limit_lane(lane, value)
                else:
                    q.weight_lane(lane, value)
    return None
