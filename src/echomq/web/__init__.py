"""The echomq dashboard: a Starlette ASGI app (``pip install 'echomq[web]'``).

Run it with ``echomq dashboard [--port 8808] [--read-only] [--app MODULE:APP]``, or mount it
in your own ASGI app::

    from echomq.web import create_app
    app.mount("/echomq", create_app(url="redis://..."))   # Starlette / FastAPI

Stable routes (bookmark and script them; every page has a JSON twin under ``/api``):

========================================  ==============================================
``GET /``                                  all queues: counts, throughput, paused
``GET /queues/<queue>``                    lanes, the four sets (``?state=&offset=&lane=``),
                                           search by id (``?id=``)
``GET /queues/<queue>/jobs/<id>``          a job: row, payload, logs, progress, events
``GET /metrics``                           the Prometheus exposition
``POST /queues/<queue>/<action>``          pause, resume, drain, pause_lane, resume_lane,
                                           limit_lane, weight_lane (form: ``lane``, ``value``)
``POST /queues/<queue>/jobs/<id>/<action>``  reprocess, remove, retry (run a scheduled job now)
``GET /api/queues``, ``/api/queues/<queue>``, ``/api/queues/<queue>/jobs/<id>``, and
``POST /api/queues/...`` (the same actions, JSON answers)
========================================  ==============================================

Actions need the token in ``ECHOMQ_DASHBOARD_TOKEN`` (without one the dashboard is read-only):
a browser signs in once (a session cookie, ``SameSite=Strict``) and every form carries a CSRF
token matched against its cookie; a script sends ``Authorization: Bearer <token>``. A session
is a random id whose record lives on the server (``{emq}:session:<sha256 of the id>``, 12 h):
"sign out" deletes it, so a copied cookie stops working too. An action is authenticated
before its body is read, and a body over 64 KiB is refused with 413, from its
``Content-Length`` or, without one, once the capped read passes the bound.
Destructive actions (remove, drain) ask for confirmation first. ``read_only=True`` hides every
action and refuses them. Every name and payload is escaped by the templates (autoescape).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from echomq import _envelope, _inspect, ids, keyspace
from echomq import _protocol as _p
from echomq._executor import SyncExecutor, sync_client
from echomq.errors import EchoMQError, InvalidArgument, InvalidId, JobGone, StateError

__all__ = ["ACTIONS", "JOB_ACTIONS", "create_app"]

HERE = Path(__file__).parent
QUEUE_ACTIONS = (
    "pause",
    "resume",
    "drain",
    "pause_lane",
    "resume_lane",
    "limit_lane",
    "weight_lane",
)
JOB_ACTIONS = ("reprocess", "remove", "retry")
ACTIONS = QUEUE_ACTIONS
DESTRUCTIVE = {"drain", "remove"}
_SESSION = "echomq_session"
_CSRF = "echomq_csrf"
_PAGE = 50
# A form of ours is a few short fields; anything larger is refused before it is buffered.
MAX_FORM = 65536
SESSION_TTL_MS = 12 * 3600 * 1000


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
    delta = (value - now_ms) / 1000
    sign = "in " if delta >= 0 else ""
    ago = "" if delta >= 0 else " ago"
    d = abs(delta)
    text = f"{d:.1f}s" if d < 120 else f"{d / 60:.1f}m" if d < 7200 else f"{d / 3600:.1f}h"
    return f"{sign}{text}{ago}"


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


async def _form(request: Request) -> dict[str, str]:
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
    return dict(pairs)


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
        return st.signed_in(request.cookies.get(_SESSION))

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
        return _inspect.snapshot(st.x, st.names(), lanes=True, minutes=30)

    def overview(request: Request) -> Response:
        return render(request, "overview.html", queues=overview_data())

    def api_overview(request: Request) -> Response:
        return JSONResponse({"queues": [v.as_dict() for v in overview_data()]})

    def queue_data(request: Request) -> dict[str, Any]:
        name = request.path_params["queue"]
        k = _p.Keys(name)
        q = request.query_params
        state = q.get("state", "pending")
        lane = q.get("lane") or None
        try:
            offset = int(q.get("offset", "0"))
        except ValueError:
            raise InvalidArgument("offset must be an int") from None
        view = _inspect.snapshot(st.x, [name], lanes=True, minutes=30)[0]
        page = _inspect.page(st.x, k, state, offset, _PAGE, lane)
        found = None
        wanted = q.get("id")
        if wanted:
            k.job(wanted.strip())  # a malformed id is InvalidId
            found = st.x.run(_p.job_state(k, wanted.strip()))
        return {"view": view, "page": page, "lane": lane, "search": wanted, "found": found}

    def queue_page(request: Request) -> Response:
        data = queue_data(request)
        return render(request, "queue.html", **data)

    def api_queue(request: Request) -> Response:
        data = queue_data(request)
        return JSONResponse(
            {
                **data["view"].as_dict(),
                "page": data["page"].as_dict(),
                "lane": data["lane"],
                "search": data["search"],
                "found": data["found"],
            }
        )

    def job_data(request: Request) -> tuple[_inspect.JobView, Any]:
        k = _p.Keys(request.path_params["queue"])
        view = _inspect.job_view(st.x, k, request.path_params["id"])
        payload = _decode_payload(st.app, view.row.get("payload") if view.row else None)
        return view, payload

    def job_page(request: Request) -> Response:
        view, payload = job_data(request)
        shown = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=repr)
        return render(request, "job.html", job=view, payload=shown)

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
        response = RedirectResponse(base + "/", status_code=303)
        response.set_cookie(
            _SESSION, st.sign_in(), httponly=True, samesite="strict", secure=_https(request)
        )
        return response

    async def logout(request: Request) -> Response:
        # Revoked on the server: the cookie (or a copy of it) signs nobody in any more.
        st.sign_out(request.cookies.get(_SESSION))
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
        if action in DESTRUCTIVE and fields.get("confirm") != "yes":
            if api:
                return error(request, 409, f"{action} is destructive: send confirm=yes", api)
            return render(
                request,
                "confirm.html",
                queue=queue,
                job_id=job_id,
                action=action,
                fields={k: v for k, v in fields.items() if k not in ("csrf", "confirm")},
            )
        try:
            _p.Keys(queue)
            result = _perform(queue, job_id, action, fields)
        except (InvalidId, InvalidArgument) as exc:
            return error(request, 400, str(exc), api)
        except JobGone as exc:
            return error(request, 404, f"no such job: {exc}", api)
        except StateError as exc:
            return error(request, 409, str(exc), api)
        st.forget()
        if api:
            return JSONResponse({"ok": True, "action": action, "result": result})
        base = request.scope.get("root_path", "")
        target = f"{base}/queues/{queue}" + (f"/jobs/{job_id}" if job_id else "")
        if action == "remove":
            target = f"{base}/queues/{queue}"
        return RedirectResponse(target, status_code=303)

    def _perform(queue: str, job_id: str | None, action: str, f: dict[str, str]) -> Any:
        from echomq.queue import Queue

        q = Queue(queue, client=st.client, retry_for=0)
        if job_id is not None:
            if action == "reprocess":
                q.reprocess(job_id)
            elif action == "remove":
                q.remove(job_id)
            else:  # retry: a scheduled job runs now, in one script
                q.run_now(job_id)
                return 1
            return None
        lane = f.get("lane") or None
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
            except EchoMQError as exc:
                return error(request, 500, str(exc), api)

        return endpoint

    routes = [
        Route("/", guard(overview, False)),
        Route("/api/queues", guard(api_overview, True)),
        Route("/metrics", guard(metrics, True)),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/queues/{queue}", guard(queue_page, False)),
        Route("/api/queues/{queue}", guard(api_queue, True)),
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


class _Static:
    """A collector of families computed once (one snapshot per scrape)."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Any:
        return iter(self._families)
