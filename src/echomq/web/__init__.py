"""The echomq dashboard: a Starlette ASGI app (``pip install 'echomq[web]'``).

Run it with ``echomq dashboard [--port 8808] [--read-only] [--app MODULE:APP]``, or mount it
in your own ASGI app::

    from echomq.web import create_app
    app.mount("/echomq", create_app(url="redis://..."))   # Starlette / FastAPI

Stable routes (bookmark and script them; every page has a JSON twin under ``/api``):

========================================  ==============================================
``GET /``                                  all queues: counts, throughput, paused
``GET /queues/<queue>``                    lanes, a state's job list
                                           (``?state=&lane=&offset=&per=``): task, arguments,
                                           attempts, priority, last error, times, worker;
                                           find (``?find=&by=id|task|error``)
``GET /queues/<queue>/jobs/<id>``          a job: row, payload, logs, progress, events
``GET /queues/<queue>/workers``            the live workers of the queue (the registry)
``GET /queues/<queue>/repeats``            the repeatable jobs: schedule, next fire, last
                                           fire, limits, paused
``GET /queues/<queue>/flows``              flow parents with their children's tree and states
``GET /queues/<queue>/charts``             completed and failed per minute, depth, oldest waiting
``GET /metrics``                           the Prometheus exposition
``GET /healthz``                           200 ``ok`` when the server answers, else 503
``POST /queues/<queue>/<action>``          pause, resume, drain, pause_lane, resume_lane,
                                           limit_lane, weight_lane (form: ``lane``, ``value``),
                                           retry_dead, delete_dead, cancel_all, selected
                                           (form: ``verb`` and one ``ids`` per job),
                                           unrepeat, pause_repeat, resume_repeat (form: ``name``)
``POST /queues/<queue>/jobs/<id>/<action>``  reprocess, remove, retry (run a scheduled job now),
                                           cancel (an active job), change_priority (form:
                                           ``priority``), reschedule (form: ``delay_s``,
                                           seconds from now), update_payload (form:
                                           ``payload``)
``GET /api/...`` twins of every page; ``POST /api/queues/...`` (the same actions, JSON)
========================================  ==============================================

Actions need the token in ``ECHOMQ_DASHBOARD_TOKEN`` (without one the dashboard is read-only):
a browser signs in once (a session cookie, ``SameSite=Strict``) and every form carries a CSRF
token matched against its cookie; a script sends ``Authorization: Bearer <token>``. A session
is a random id whose record lives on the server (``{emq}:session:<sha256 of the id>``, 12 h):
"sign out" deletes it, so a copied cookie stops working too. An action is authenticated
before its body is read, and a body over 64 KiB is refused with 413, from its
``Content-Length`` or, without one, once the capped read passes the bound.
Destructive actions (remove, drain, cancel, delete_dead, cancel_all, unrepeat and a selection's
remove or cancel) ask for confirmation first. ``read_only=True`` hides every
action and refuses them. Every name and payload is escaped by the templates (autoescape).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import decimal
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from echomq import _console, _envelope, _inspect, _registry, ids, keyspace
from echomq import _kernel as _k
from echomq import _protocol as _p
from echomq._connect import TRANSIENT
from echomq._executor import SyncExecutor, sync_client
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    InvalidId,
    JobGone,
    StateError,
)

__all__ = ["ACTIONS", "JOB_ACTIONS", "JobAction", "create_app"]

HERE = Path(__file__).parent
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


def _cancel(q: Any, job_id: str, _f: dict[str, str], _app: Any) -> str:
    outcome: str = q.cancel(job_id)
    if outcome == "absent":
        raise JobGone(job_id)
    return outcome


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
            lambda q, i, f, a: q.remove(i),
        ),
    )
}
JOB_ACTIONS = tuple(JOB_TABLE)
# The verbs a list's selection can apply (the names of `_console.bulk`).
SELECTION = {"reprocess": "reprocess", "retry": "run_now", "cancel": "cancel", "remove": "remove"}
ACTIONS = QUEUE_ACTIONS
DESTRUCTIVE = {"drain", "delete_dead", "cancel_all", "unrepeat"} | {
    a.name for a in JOB_TABLE.values() if a.destructive
}
# A list's page sizes; the states a list shows (the set names, "schedule" for scheduled).
PAGE_SIZES = (10, 25, 50, 100, 200, 500)
LIST_STATES = ("pending", "active", "schedule", "dead", "completed")
_SESSION = "echomq_session"
_CSRF = "echomq_csrf"
_PAGE = 50
# A form of ours is a few short fields; anything larger is refused before it is buffered.
MAX_FORM = 65536
SESSION_TTL_MS = 12 * 3600 * 1000
# How long the overview rides out a failover (the cluster's slot map re-read, the reads
# asked again) before it answers 503: a request should not hang for a whole outage.
_RIDE_OUT_S = 5.0


class _State:
    def __init__(
        self,
        client: Any,
        *,
        read_only: bool,
        token: str | None,
        app: Any,
        queues: Sequence[str] | None,
        discover_s: float,
    ) -> None:
        self.client = client
        self.x = SyncExecutor(client, retry_for=0)
        self.read_only = read_only
        self.token = token or None
        self.app = app
        self.fixed = list(queues) if queues else None
        self.discover_s = discover_s
        self._found: list[str] = []
        self._found_at = -1e18
        self._lock = threading.Lock()
        # Depth and oldest-waiting history for the charts: the server keeps per-minute
        # completions and failures (D16) but no depth history, so this process samples it
        # whenever it reads a queue (its pages and their live refresh), one point a minute.
        self.samples: dict[str, collections.OrderedDict[int, tuple[int, float | None]]] = {}

    def _session(self, sid: str) -> tuple[str, bytes] | None:
        """The server key of session id ``sid`` and the value it holds while signed in: an
        HMAC of the id under the token, so a session minted under another token is void."""
        if not self.token or not sid or len(sid) > 128:
            return None
        digest = hashlib.sha256(sid.encode()).hexdigest()
        tag = hmac.new(self.token.encode(), sid.encode(), hashlib.sha256).hexdigest()
        return keyspace.session_key(digest), tag.encode()

    def sign_in(self) -> str:
        """A fresh session id, recorded on the server with its TTL."""
        sid = secrets.token_urlsafe(32)
        record = self._session(sid)
        assert record is not None
        self.client.set(record[0], record[1], px=SESSION_TTL_MS)
        return sid

    def signed_in(self, sid: str | None) -> bool:
        record = self._session(sid or "")
        if record is None:
            return False
        held = self.client.get(record[0])
        if isinstance(held, str):
            held = held.encode()
        return held is not None and hmac.compare_digest(held, record[1])

    def sign_out(self, sid: str | None) -> None:
        record = self._session(sid or "")
        if record is not None:
            self.client.delete(record[0])

    @property
    def actions(self) -> bool:
        return not self.read_only and self.token is not None

    def names(self) -> list[str]:
        if self.fixed is not None:
            return self.fixed
        with self._lock:
            now = time.monotonic()
            if now - self._found_at >= self.discover_s:
                self._found = _inspect.discover(self.client)
                self._found_at = now
            return self._found

    def forget(self) -> None:
        with self._lock:
            self._found_at = -1e18

    def exists(self, name: str) -> bool:
        """Whether queue ``name`` is one to show: a configured one, or one with keys (the
        discovery's cached list, else one EXISTS over the queue's own key types)."""
        keyspace.check_queue(name)  # a malformed name is InvalidId (400) before any I/O
        if self.fixed is not None:
            return name in self.fixed
        # One EXISTS first: the discovery SCAN walks the whole keyspace (a second or more
        # on a 1M-job server), so a page of a live queue never waits for it.
        keys = [keyspace.queue_key(name, t) for t in sorted(keyspace.QUEUE_TYPES)]
        if int(self.client.execute_command("EXISTS", *keys)):
            return True
        return name in self.names()

    def sample(self, view: _inspect.QueueView) -> None:
        minute = view.now_ms // 60_000
        depth = view.counts.get("pending", 0)
        with self._lock:
            points = self.samples.setdefault(view.name, collections.OrderedDict())
            points[minute] = (depth, view.oldest_waiting_age_s)
            while points and next(iter(points)) <= minute - 60:
                points.popitem(last=False)


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


def _https(request: Request) -> bool:
    # Cookies are marked Secure whenever the page itself came over TLS.
    return request.url.scheme == "https"


class _TooLarge(Exception):
    """A request body over :data:`MAX_FORM`."""


class _Fields(dict[str, str]):
    """A form's fields (the last value of each) and every value of a repeated one."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs

    def every(self, name: str) -> list[str]:
        return [v for k, v in self.pairs if k == name]


async def _form(request: Request) -> _Fields:
    """The urlencoded form of a POST (the only kind the pages send; no multipart parser
    needed). A body over :data:`MAX_FORM` is not a form of ours: refused (``_TooLarge``) from
    its ``Content-Length`` before a byte is read, or, chunked, once the read passes the
    bound, so no request can make the process buffer more than that."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise InvalidArgument("a malformed Content-Length")
        if int(declared) > MAX_FORM:
            raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM:
            raise _TooLarge
        chunks.append(chunk)
    body = b"".join(chunks)
    pairs = urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return _Fields(pairs)


def create_app(
    url: str | None = None,
    *,
    client: Any = None,
    read_only: bool = False,
    token: str | None = None,
    app: Any = None,
    queues: Sequence[str] | None = None,
    discover_s: float = 5.0,
    poll_ms: int = 2000,
) -> Starlette:
    """The dashboard as an ASGI app.

    Args:
        url / client: the server (default ``ECHOMQ_URL``); a client passed in is not closed.
        read_only: hide and refuse every action.
        token: the action token (default ``ECHOMQ_DASHBOARD_TOKEN``; none: read-only).
        app: an :class:`echomq.App` whose serializer decodes payloads on job pages.
        queues: the queues to show (default: every queue found on the server, re-discovered
            at most every ``discover_s`` seconds).
        poll_ms: the pages' live-update period (at least 1000: at most 1 request/s).
    """
    if isinstance(poll_ms, bool) or not isinstance(poll_ms, int) or poll_ms < 1000:
        raise InvalidArgument(f"poll_ms must be an int >= 1000, got {poll_ms!r}")
    owned = client is None
    st = _State(
        client if client is not None else sync_client(url),
        read_only=read_only,
        token=token if token is not None else os.environ.get("ECHOMQ_DASHBOARD_TOKEN"),
        app=app,
        queues=queues,
        discover_s=discover_s,
    )
    env = _env()

    def render(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        csrf = request.cookies.get(_CSRF) or secrets.token_urlsafe(24)
        ctx.setdefault("now_ms", int(time.time() * 1000))
        ctx.update(
            base=request.scope.get("root_path", ""),
            actions=st.actions,
            read_only=st.read_only,
            has_token=st.token is not None,
            signed_in=_signed_in(request),
            csrf=csrf,
            poll_ms=poll_ms,
        )
        response = HTMLResponse(env.get_template(name).render(**ctx), status_code=status)
        if request.cookies.get(_CSRF) != csrf:
            response.set_cookie(
                _CSRF, csrf, httponly=True, samesite="strict", secure=_https(request)
            )
        return response

    def _signed_in(request: Request) -> bool:
        try:
            return st.signed_in(request.cookies.get(_SESSION))
        except TRANSIENT:
            return False  # the server is down: the page (an error page) renders signed out

    def _bearer(request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        if not st.token or not auth.lower().startswith("bearer "):
            return False
        return hmac.compare_digest(auth[7:].strip().encode(), st.token.encode())

    def error(request: Request, status: int, message: str, api: bool) -> Response:
        if api:
            return JSONResponse({"error": message}, status_code=status)
        return render(request, "error.html", status=status, message=message)

    # ------------------------------------------------------------------ pages

    def overview_data() -> list[_inspect.QueueView]:
        return _inspect.riding_out(
            st.x, lambda: _inspect.snapshot(st.x, st.names(), lanes=True, minutes=30), _RIDE_OUT_S
        )

    def overview(request: Request) -> Response:
        return render(request, "overview.html", queues=overview_data())

    def api_overview(request: Request) -> Response:
        return JSONResponse({"queues": [v.as_dict() for v in overview_data()]})

    def _queue_name(request: Request) -> str:
        """The path's queue, known to exist: a malformed name is a 400, an unknown one 404."""
        name: str = request.path_params["queue"]
        if not st.exists(name):
            raise _NoSuchQueue(name)
        return name

    def _int_param(request: Request, name: str, default: int) -> int:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        if not raw.strip().isdigit() or len(raw) > 12:
            raise InvalidArgument(f"{name} must be a non-negative int, got {raw[:40]!r}")
        return int(raw)

    def _serializer() -> Any:
        return getattr(st.app, "serializer", None)

    def queue_data(request: Request) -> dict[str, Any]:
        name = _queue_name(request)
        k = _p.Keys(name)
        q = request.query_params
        state = q.get("state", "pending")
        if state == "scheduled":
            state = "schedule"
        if state not in LIST_STATES:
            raise InvalidArgument(f"state must be one of {', '.join(LIST_STATES)}, got {state!r}")
        lane = q.get("lane") or None
        per = _int_param(request, "per", _PAGE)
        if per not in PAGE_SIZES:
            raise InvalidArgument(f"per must be one of {', '.join(map(str, PAGE_SIZES))}")
        offset = _int_param(request, "offset", 0)
        view = _inspect.snapshot(st.x, [name], lanes=True, minutes=30)[0]
        st.sample(view)
        page = _inspect.page(st.x, k, state, offset, per, lane)
        if page.total and offset >= page.total:
            raise _PastTheEnd(f"offset {offset:,} is past the last job ({page.total:,})")
        rows = _console.rows(st.x, k, page.items, state, serializer=_serializer())
        found = None
        wanted = (q.get("find") or "").strip()
        if wanted:
            by = q.get("by") or "id"
            found = _console.find(st.x, k, state, by, wanted, serializer=_serializer(), group=lane)
        place = None
        exact = (q.get("id") or "").strip()
        if exact:  # one whole id, in whatever state it is
            k.job(exact)  # a malformed id is InvalidId
            place = st.x.run(_p.job_state(k, exact))
        last = max(0, (page.total - 1) // per * per)
        return {
            "view": view,
            "page": page,
            "rows": rows,
            "lane": lane,
            "per": per,
            "last_offset": last,
            "search": wanted,
            "by": q.get("by") or "id",
            "found": found,
            "exact": exact,
            "place": place,
        }

    def queue_page(request: Request) -> Response:
        data = queue_data(request)
        return render(request, "queue.html", **data, job_table=JOB_TABLE, selection=SELECTION)

    def api_queue(request: Request) -> Response:
        data = queue_data(request)
        return JSONResponse(
            {
                **data["view"].as_dict(),
                "page": data["page"].as_dict(),
                "rows": [r.as_dict() for r in data["rows"]],
                "lane": data["lane"],
                "search": data["exact"] or None,
                "found": data["place"],
                "find": data["found"].as_dict() if data["found"] else None,
            }
        )

    def workers_data(request: Request) -> dict[str, Any]:
        name = _queue_name(request)
        found = st.x.run(_registry.list_workers(_p.Keys(name)))
        now = st.x.run(_cmd_time())
        return {"queue": name, "workers": found, "now_ms": now}

    def workers_page(request: Request) -> Response:
        return render(request, "workers.html", **workers_data(request))

    def api_workers(request: Request) -> Response:
        data = workers_data(request)
        shown = [dataclasses.asdict(w) for w in data["workers"]]
        return JSONResponse({"queue": data["queue"], "workers": shown})

    def repeats_data(request: Request) -> dict[str, Any]:
        from echomq import _compose

        name = _queue_name(request)
        found = st.x.run(_compose.repeats(_p.Keys(name)))
        return {"queue": name, "repeats": found, "now_ms": st.x.run(_cmd_time())}

    def repeats_page(request: Request) -> Response:
        return render(request, "repeats.html", **repeats_data(request))

    def api_repeats(request: Request) -> Response:
        data = repeats_data(request)
        shown = [dataclasses.asdict(r) for r in data["repeats"]]
        return JSONResponse({"queue": data["queue"], "repeats": shown})

    def flows_data(request: Request) -> dict[str, Any]:
        name = _queue_name(request)
        view = _console.flows(st.x, st.client, _p.Keys(name), serializer=_serializer())
        return {"queue": name, "flows": view}

    def flows_page(request: Request) -> Response:
        return render(request, "flows.html", **flows_data(request))

    def api_flows(request: Request) -> Response:
        v = flows_data(request)["flows"]
        return JSONResponse(
            {
                "parents": [p.as_dict() for p in v.parents],
                "scanned": v.scanned,
                "keyspace": v.keyspace,
                "complete": v.complete,
            }
        )

    def charts_data(request: Request) -> dict[str, Any]:
        name = _queue_name(request)
        view = _inspect.snapshot(st.x, [name], lanes=True, minutes=60)[0]
        st.sample(view)
        minute = view.now_ms // 60_000
        with st._lock:
            points = dict(st.samples.get(name, {}))
        depth = [points[m][0] if m in points else None for m in range(minute - 59, minute + 1)]
        oldest = [points[m][1] if m in points else None for m in range(minute - 59, minute + 1)]
        return {
            "view": view,
            "completed": list(reversed(view.completed)),
            "failed": list(reversed(view.failed)),
            "depth": depth,
            "oldest": oldest,
        }

    def charts_page(request: Request) -> Response:
        return render(request, "charts.html", **charts_data(request))

    def api_charts(request: Request) -> Response:
        data = charts_data(request)
        return JSONResponse(
            {
                "queue": data["view"].name,
                "completed_per_minute": data["completed"],
                "failed_per_minute": data["failed"],
                "depth": data["depth"],
                "oldest_waiting_s": data["oldest"],
            }
        )

    def healthz(request: Request) -> Response:
        try:
            st.client.ping()
        except Exception as exc:  # every failure to answer is "unreachable" here
            return Response(
                f"unreachable: {type(exc).__name__}: {exc}\n",
                status_code=503,
                media_type="text/plain",
                headers={"Retry-After": "2"},
            )
        return Response("ok\n", media_type="text/plain")

    def job_data(request: Request) -> tuple[_inspect.JobView, Any]:
        k = _p.Keys(_queue_name(request))
        view = _inspect.job_view(st.x, k, request.path_params["id"])
        payload = _decode_payload(st.app, view.row.get("payload") if view.row else None)
        return view, payload

    def job_page(request: Request) -> Response:
        view, payload = job_data(request)
        shown = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=repr)
        return render(
            request,
            "job.html",
            job=view,
            payload=shown,
            payload_call=isinstance(payload, dict),
            job_table=JOB_TABLE,
        )

    def api_job(request: Request) -> Response:
        view, payload = job_data(request)
        return JSONResponse(json.loads(json.dumps(view.as_dict(payload), default=repr)))

    def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from echomq import prometheus

        views = _inspect.snapshot(st.x, st.names(), lanes=True, minutes=2)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Static(list(prometheus.families(views))))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ sign-in

    async def login(request: Request) -> Response:
        base = request.scope.get("root_path", "")
        if request.method == "GET":
            return render(request, "login.html", failed=False)
        csrf_refused = "the form's CSRF token does not match: reload and retry"
        if not request.cookies.get(_CSRF):
            # No form of ours was served to this client: refused before its body is read.
            return error(request, 403, csrf_refused, False)
        try:
            form = await _form(request)
        except _TooLarge:
            return error(request, 413, f"a request body is at most {MAX_FORM} bytes", False)
        except InvalidArgument as exc:
            return error(request, 400, str(exc), False)
        if not _csrf_ok(request, form):
            return error(request, 403, csrf_refused, False)
        given = str(form.get("token", ""))
        if not st.token or not hmac.compare_digest(given.encode(), st.token.encode()):
            return render(request, "login.html", status=403, failed=True)
        try:
            sid = st.sign_in()
        except TRANSIENT as exc:
            return _unreachable(request, exc, False)
        response = RedirectResponse(base + "/", status_code=303)
        response.set_cookie(_SESSION, sid, httponly=True, samesite="strict", secure=_https(request))
        return response

    async def logout(request: Request) -> Response:
        # Revoked on the server: the cookie (or a copy of it) signs nobody in any more.
        try:
            st.sign_out(request.cookies.get(_SESSION))
        except TRANSIENT as exc:
            return _unreachable(request, exc, False)
        response = RedirectResponse(request.scope.get("root_path", "") + "/", status_code=303)
        response.delete_cookie(_SESSION)
        return response

    def _csrf_ok(request: Request, form: Any) -> bool:
        cookie = request.cookies.get(_CSRF)
        sent = str(form.get("csrf", ""))
        return bool(cookie and sent and hmac.compare_digest(cookie.encode(), sent.encode()))

    # ------------------------------------------------------------------ actions

    async def act(request: Request) -> Response:
        api = request.url.path.startswith(request.scope.get("root_path", "") + "/api/")
        queue = request.path_params["queue"]
        job_id = request.path_params.get("id")
        action = request.path_params["action"]
        allowed = JOB_ACTIONS if job_id else QUEUE_ACTIONS
        if action not in allowed:
            return error(request, 404, f"unknown action {action!r}", api)
        if st.read_only:
            return error(request, 403, "the dashboard is read-only", api)
        if not st.token:
            return error(request, 403, "actions need ECHOMQ_DASHBOARD_TOKEN on the server", api)
        # Authenticated before the body is read: an anonymous client never gets it buffered.
        bearer = _bearer(request)
        if not bearer and not _signed_in(request):
            return error(request, 401, "sign in with the dashboard token first", api)
        try:
            form = await _form(request)
        except _TooLarge:
            return error(request, 413, f"a request body is at most {MAX_FORM} bytes", api)
        except InvalidArgument as exc:
            return error(request, 400, str(exc), api)
        # A script with the token sends no cookie, so it has no CSRF to guard against.
        if not bearer and not _csrf_ok(request, form):
            return error(
                request, 403, "the form's CSRF token does not match: reload and retry", api
            )
        fields = {k: str(v) for k, v in form.items()}
        selected = form.every("ids")
        destructive = action in DESTRUCTIVE or (
            action == "selected" and fields.get("verb") in ("remove", "cancel")
        )
        if destructive and fields.get("confirm") != "yes":
            if api:
                return error(request, 409, f"{action} is destructive: send confirm=yes", api)
            return render(
                request,
                "confirm.html",
                queue=queue,
                job_id=job_id,
                action=action,
                fields={k: v for k, v in fields.items() if k not in ("csrf", "confirm", "ids")},
                selected=selected,
            )
        try:
            if not st.exists(queue):
                return error(request, 404, f"no such queue: {queue!r}", api)
            result = _perform(queue, job_id, action, fields, selected)
        except (InvalidId, InvalidArgument) as exc:
            return error(request, 400, str(exc), api)
        except JobGone as exc:
            return error(request, 404, f"no such job: {exc}", api)
        except _NoSuchRepeat as exc:
            return error(request, 404, str(exc), api)
        except StateError as exc:
            return error(request, 409, str(exc), api)
        except TRANSIENT as exc:
            return _unreachable(request, exc, api)
        st.forget()
        if api:
            return JSONResponse({"ok": True, "action": action, "result": result})
        base = request.scope.get("root_path", "")
        target = f"{base}/queues/{queue}" + (f"/jobs/{job_id}" if job_id else "")
        if action in {"remove", "selected"} or action.endswith("_dead"):
            back = fields.get("back", "")
            # Only a path of this dashboard's queue page: never an open redirect.
            target = f"{base}/queues/{queue}" + (back if back.startswith("?") else "")
        elif action in ("unrepeat", "pause_repeat", "resume_repeat"):
            target = f"{base}/queues/{queue}/repeats"
        return RedirectResponse(target, status_code=303)

    def _perform(
        queue: str, job_id: str | None, action: str, f: dict[str, str], selected: list[str]
    ) -> Any:
        from echomq.queue import Queue

        q = Queue(queue, client=st.client, retry_for=0)
        if job_id is not None:
            q._k.job(job_id)  # a malformed id is InvalidId (400) before the verb runs
            return JOB_TABLE[action].run(q, job_id, f, st.app)
        lane = f.get("lane") or None
        if action == "retry_dead":
            return q.reprocess_all("dead")
        if action == "delete_dead":
            return _console.bulk(q, "remove")
        if action == "cancel_all":
            return q.cancel_all()
        if action == "selected":
            verb = f.get("verb", "")
            if verb not in SELECTION:
                raise InvalidArgument(f"a selection's verb is one of {', '.join(SELECTION)}")
            if not selected or len(selected) > 1000:
                raise InvalidArgument("select 1 to 1000 jobs")
            for one in selected:
                q._k.job(one)  # every id checked before the first one moves
            return _console.bulk(q, SELECTION[verb], selected)
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
            return q.drain(include_schedule=f.get("include_schedule") == "1")
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

    # ------------------------------------------------------------------ errors

    def guard(fn: Any, api: bool) -> Any:
        def endpoint(request: Request) -> Response:
            try:
                response: Response = fn(request)
                return response
            except (InvalidId, InvalidArgument) as exc:
                return error(request, 400, str(exc), api)
            except _NoSuchQueue as exc:
                return error(request, 404, str(exc), api)
            except _PastTheEnd as exc:
                return error(request, 404, str(exc), api)
            except TRANSIENT as exc:
                return _unreachable(request, exc, api)
            except EchoMQError as exc:
                return error(request, 500, str(exc), api)

        return endpoint

    def _unreachable(request: Request, exc: BaseException, api: bool) -> Response:
        # A read that did not get through in time (a failover longer than the overview
        # waits, a server down): unavailable for now, not a server bug, never a traceback.
        with contextlib.suppress(Exception):
            st.x.follow()
        response = error(request, 503, f"the server is unreachable for now: {exc}", api)
        response.headers["Retry-After"] = "2"
        return response

    routes = [
        Route("/", guard(overview, False)),
        Route("/api/queues", guard(api_overview, True)),
        Route("/metrics", guard(metrics, True)),
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/queues/{queue}", guard(queue_page, False)),
        Route("/api/queues/{queue}", guard(api_queue, True)),
        Route("/queues/{queue}/workers", guard(workers_page, False)),
        Route("/api/queues/{queue}/workers", guard(api_workers, True)),
        Route("/queues/{queue}/repeats", guard(repeats_page, False)),
        Route("/api/queues/{queue}/repeats", guard(api_repeats, True)),
        Route("/queues/{queue}/flows", guard(flows_page, False)),
        Route("/api/queues/{queue}/flows", guard(api_flows, True)),
        Route("/queues/{queue}/charts", guard(charts_page, False)),
        Route("/api/queues/{queue}/charts", guard(api_charts, True)),
        Route("/queues/{queue}/jobs/{id}", guard(job_page, False)),
        Route("/api/queues/{queue}/jobs/{id}", guard(api_job, True)),
        Route("/queues/{queue}/jobs/{id}/{action}", act, methods=["POST"]),
        Route("/api/queues/{queue}/jobs/{id}/{action}", act, methods=["POST"]),
        Route("/queues/{queue}/{action}", act, methods=["POST"]),
        Route("/api/queues/{queue}/{action}", act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned:
                st.client.close()

    web = Starlette(routes=routes, lifespan=lifespan)
    web.state.dashboard = st
    return web


class _NoSuchQueue(EchoMQError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no such queue: {name!r}")


class _NoSuchRepeat(EchoMQError):
    """A pause or resume of a repeat name not registered on the queue: 404."""


class _PastTheEnd(EchoMQError):
    """A page past the last one (a huge offset): 404, not an empty page."""


def _cmd_time() -> Any:
    return _k._cmd(("TIME",), lambda r: int(r[0]) * 1000 + int(r[1]) // 1000)


class _Static:
    """A collector of families computed once (one snapshot per scrape)."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Any:
        return iter(self._families)
