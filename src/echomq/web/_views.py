"""The dashboard's template helpers: filters, payloads, page sizes.

What the dashboard's pages show and how: the templates' environment and filters (human
times with the raw value on hover, thousands separators, sparklines and bars), a decoded
payload, and the page sizes and list states."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from echomq import ids
from echomq.ops import console as _console
from echomq.protocol import envelope as _envelope

HERE = Path(__file__).parent


# A list's page sizes; the states a list shows (the set names, "schedule" for scheduled).
PAGE_SIZES = (10, 25, 50, 100, 200, 500)


LIST_STATES = ("pending", "active", "schedule", "dead", "completed")


_PAGE = 50


def _sparkline(values: Sequence[int], width: int = 120, height: int = 24) -> Markup:
    """An inline SVG of per-minute counts (current minute at the right)."""
    pts = list(reversed(values))
    if not pts:
        return Markup("")
    top = max(pts) or 1
    step = width / max(1, len(pts) - 1)
    coords = " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(pts)
    )
    # Only numbers go into the markup: nothing user-controlled.
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-hidden="true"><polyline fill="none" stroke="currentColor" stroke-width="1.5" '
        f'points="{coords}"/></svg>'
    )


def _ms(value: int | None, now_ms: int) -> str:
    if value is None:
        return ""
    delta = value - now_ms
    text = _console.human(delta)
    return f"in {text}" if delta >= 0 else f"{text} ago"


def _when(value: int | None, now_ms: int) -> Markup:
    """A time as a person reads it ("3.2m ago", "in 4.0s"), the raw value on hover: the
    UTC date and the unix ms. Only numbers and fixed words go into the markup."""
    if value is None:
        return Markup('<span class="muted">—</span>')
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value / 1000))
    return Markup(
        f'<time datetime="{stamp}Z" title="{stamp} UTC ({int(value)} unix ms)">'
        f"{_ms(int(value), now_ms)}</time>"
    )


def _span(value: int | None, now_ms: int) -> Markup:
    """How long since ``value`` (a run time, an age), the raw value on hover."""
    if value is None:
        return Markup('<span class="muted">—</span>')
    text = _console.human(max(0, now_ms - value))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value / 1000))
    return Markup(f'<time title="since {stamp} UTC ({int(value)} unix ms)">{text}</time>')


def _thousands(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _bars(
    values: Sequence[float | None], *, width: int = 720, height: int = 120, cls: str = "bars"
) -> Markup:
    """A bar chart of ``values`` (oldest at the left), each bar titled with its value, the
    maximum labelled: server-rendered SVG, readable without JavaScript. Only numbers go
    into the markup."""
    n = max(1, len(values))
    top = max((v for v in values if v is not None), default=0) or 1
    step = width / n
    bars = []
    for i, v in enumerate(values):
        if v is None:
            continue
        h = (v / top) * (height - 16)
        label = f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"
        bars.append(
            f'<rect x="{i * step + 1:.1f}" y="{height - h:.1f}" width="{max(1.0, step - 2):.1f}" '
            f'height="{h:.1f}"><title>{n - i - 1} min ago: {label}</title></rect>'
        )
    top_label = f"{top:,.1f}" if isinstance(top, float) else f"{top:,}"
    return Markup(
        f'<svg class="{cls}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img"><text x="2" y="11" class="axis">max {top_label}</text>{"".join(bars)}'
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" class="axis"/></svg>'
    )


def _id_time(job_id: str) -> int | None:
    try:
        return ids.decode_time_ms(job_id)
    except ValueError:
        return None


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.globals["sparkline"] = _sparkline
    env.filters["rel"] = _ms
    env.globals["id_time"] = _id_time
    env.globals["when"] = _when
    env.globals["span"] = _span
    env.globals["bars"] = _bars
    env.filters["n"] = _thousands
    return env


def _decode_payload(app: Any, payload: bytes | str | None) -> Any:
    """The payload for display: the task call through the app's serializer when an app is
    given, else text (or a repr of binary data). Never evaluated, always escaped later."""
    if payload is None:
        return None
    data = payload.encode() if isinstance(payload, str) else payload
    if app is not None:
        try:
            task, args, kwargs = _envelope.parse(app.serializer, data)
            return {"task": task, "args": args, "kwargs": kwargs}
        except Exception:  # not an envelope: shown raw below
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return repr(data)


def _decode_result(app: Any, value: bytes) -> str:
    """A kept result for display: decoded by the app's serializer when given, else as JSON
    when it parses, else its text (or a repr of binary data); pretty-printed when it is a
    structure. Never evaluated, always escaped later."""
    if app is not None:
        try:
            return _pretty(app.serializer.loads(value))
        except Exception:  # not the app's encoding: the fallbacks below
            pass
    try:
        return _pretty(json.loads(value))
    except ValueError:
        pass
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return repr(value)


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, default=repr, ensure_ascii=False)


# A row's fields that are times (server ms): shown as times, the raw value on hover.
TIME_FIELDS = frozenset({"finished_ms", "claimed_ms", "expires"})

# The row fields the job page's summary shows in words; the rest of the row (the protocol's
# bookkeeping: lease_epoch, floor, flow, kids...) is under "details".
SUMMARY_FIELDS = frozenset(
    {"attempts", "group", "priority", "progress", "last_error", "parent", "expires", "finished_ms"}
)


@dataclass
class EventRow:
    """One row of a job page's events: an event, or a run of consecutive progress updates
    folded into one (their count and the last value)."""

    stream_id: str
    event: str
    fields: dict[str, str]
    at_ms: int | None
    count: int = 1


def fold_events(events: Sequence[Any]) -> list[EventRow]:
    """The job's events with each run of consecutive ``progress`` updates as one row (a
    handler reporting progress often would bury the rest)."""
    out: list[EventRow] = []
    for e in events:
        at = _stream_ms(e.stream_id)
        last = out[-1] if out else None
        if e.event == "progress" and last is not None and last.event == "progress":
            last.count += 1
            last.stream_id, last.fields, last.at_ms = e.stream_id, dict(e.fields), at
            continue
        out.append(EventRow(e.stream_id, e.event, dict(e.fields), at))
    return out


def _stream_ms(stream_id: str) -> int | None:
    """The server ms a stream entry was added at (its id's first part)."""
    head = stream_id.partition("-")[0]
    return int(head) if head.isdigit() else None
