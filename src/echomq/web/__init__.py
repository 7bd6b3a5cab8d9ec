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
``GET /api/queues/<queue>/backlog``        the autoscaling signal (JSON, ``echomq backlog``)
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
remove or cancel) ask for confirmation first. After an action the page it lands on shows what
was done once (a flash message, from a short-lived ``SameSite=Strict`` cookie).
``read_only=True`` hides every action and refuses them. Every name and payload is escaped by
the templates (autoescape).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import Any

from echomq.protocol import extras as _extras

# The web extra's own feature (its submodules import starlette and jinja2 too, after this):
# without the extra, importing it is one line naming what to install (MissingExtra).
try:
    import jinja2  # noqa: F401 - echomq.web._views renders with it
    import prometheus_client  # noqa: F401 - /metrics
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError as exc:
    raise _extras.missing("web", "the dashboard (echomq.web)", exc) from exc

from echomq.client.connect import TRANSIENT
from echomq.client.executor import sync_client
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    InvalidId,
)
from echomq.ops import backlog as _backlog
from echomq.ops import console as _console
from echomq.ops import flowtree as _flowtree
from echomq.ops import sharded as _sharded
from echomq.ops import snapshots as _inspect
from echomq.protocol import calls as _p
from echomq.protocol import control as _ctl
from echomq.protocol import kernel as _k
from echomq.protocol import registry as _registry
from echomq.web._session import (
    _CSRF,
    _FLASH,
    _SESSION,
    _https,
    _State,
)
from echomq.web._views import (
    _PAGE,
    HERE,
    LIST_STATES,
    PAGE_SIZES,
    SUMMARY_FIELDS,
    TIME_FIELDS,
    _decode_payload,
    _decode_result,
    _env,
    fold_events,
)
from echomq.web._writes import _FLASH_MAX, _Writes
from echomq.web.actions import (
    ACTIONS,
    JOB_ACTIONS,
    JOB_TABLE,
    SELECTION,
    JobAction,
)

__all__ = ["ACTIONS", "JOB_ACTIONS", "JobAction", "create_app"]


# How long the overview rides out a failover (the cluster's slot map re-read, the reads
# asked again) before it answers 503: a request should not hang for a whole outage.
_RIDE_OUT_S = 5.0


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
        flash = request.cookies.get(_FLASH)
        ctx["flash"] = urllib.parse.unquote(flash)[:_FLASH_MAX] if flash else None
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
        if flash:
            response.delete_cookie(_FLASH)  # shown once
        return response

    def _signed_in(request: Request) -> bool:
        try:
            return st.signed_in(request.cookies.get(_SESSION))
        except TRANSIENT:
            return False  # the server is down: the page (an error page) renders signed out

    def error(request: Request, status: int, message: str, api: bool) -> Response:
        if api:
            return JSONResponse({"error": message}, status_code=status)
        return render(request, "error.html", status=status, message=message)

    # ------------------------------------------------------------------ pages

    def overview_data() -> list[_inspect.QueueView]:
        return _inspect.riding_out(
            st.x, lambda: _sharded.snapshot(st.x, st.names(), lanes=True, minutes=30), _RIDE_OUT_S
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
        view = _sharded.snapshot(st.x, [name], lanes=True, minutes=30)[0]  # a sharded one: sums
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

    def api_backlog(request: Request) -> Response:
        # The autoscaling signal (echomq.ops.backlog) for KEDA's metrics-api scaler.
        found = _backlog.backlogs(st.x, [_queue_name(request)])[0]
        return JSONResponse(found.as_dict())

    def workers_data(request: Request) -> dict[str, Any]:
        name = _queue_name(request)
        found = st.x.run(_registry.list_workers(_p.Keys(name)))
        now = st.x.run(_cmd_time())
        spread = _registry.version_spread(found)
        return {"queue": name, "workers": found, "now_ms": now, "spread": spread}

    def workers_page(request: Request) -> Response:
        return render(request, "workers.html", **workers_data(request))

    def api_workers(request: Request) -> Response:
        data = workers_data(request)
        shown = [dataclasses.asdict(w) for w in data["workers"]]
        return JSONResponse({"queue": data["queue"], "workers": shown, "warning": data["spread"]})

    def repeats_data(request: Request) -> dict[str, Any]:
        from echomq.protocol import compose as _compose

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
        view = _flowtree.flows(st.x, st.client, _p.Keys(name), serializer=_serializer())
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
        view = _sharded.snapshot(st.x, [name], lanes=True, minutes=60)[0]
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

    def kept_outcome(k: _p.Keys, job_id: str) -> Any:
        """The job's kept outcome (D17), or None. Not the stand-in ``result`` answers for a
        dead row without one (``finished_ms`` 0): the row shows that death already."""
        kept = st.x.run(_ctl.result(k, job_id))
        return kept if kept is not None and kept.finished_ms else None

    def job_page(request: Request) -> Response:
        view, payload = job_data(request)
        shown = payload if isinstance(payload, str) else json.dumps(payload, indent=2, default=repr)
        k = _p.Keys(view.queue)
        # The summary: the job as its place's list shows it (task, arguments, the worker
        # holding it and its lease end, its run time, death or finish), and its kept result.
        summary = (
            _console.job_row(st.x, k, view.id, view.place, serializer=_serializer())
            if view.row is not None
            else None
        )
        kept = kept_outcome(k, view.id)
        return render(
            request,
            "job.html",
            job=view,
            summary=summary,
            kept=kept,
            kept_value=_decode_result(st.app, kept.value) if kept and kept.value else None,
            details=sorted(
                (f, v) for f, v in (view.row or {}).items() if f not in SUMMARY_FIELDS | {"payload"}
            ),
            time_fields=TIME_FIELDS,
            events=fold_events(view.events),
            payload=shown,
            payload_call=isinstance(payload, dict),
            job_table=JOB_TABLE,
        )

    def api_job(request: Request) -> Response:
        view, payload = job_data(request)
        data = view.as_dict(payload)
        # What the page shows beyond the row: the kept outcome, decoded as the page shows it.
        kept = kept_outcome(_p.Keys(view.queue), view.id)
        data["result"] = kept and {
            "value": _decode_result(st.app, kept.value) if kept.value else None,
            "error": kept.error,
            "finished_ms": kept.finished_ms,
            "attempts": kept.attempts,
        }
        return JSONResponse(json.loads(json.dumps(data, default=repr)))

    def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from echomq import prometheus

        views = _sharded.snapshot(st.x, st.names(), lanes=True, minutes=2)
        registry = CollectorRegistry(auto_describe=False)
        found = _backlog.of_views(st.x, views)  # the autoscaling gauges too
        registry.register(
            _Static([*prometheus.families(views), *prometheus.backlog_families(found)])
        )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

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

    writes = _Writes(st, render, error, _unreachable, _signed_in)
    routes = [
        Route("/", guard(overview, False)),
        Route("/api/queues", guard(api_overview, True)),
        Route("/metrics", guard(metrics, True)),
        Route("/healthz", healthz),
        Route("/login", writes.login, methods=["GET", "POST"]),
        Route("/logout", writes.logout, methods=["POST"]),
        Route("/queues/{queue}", guard(queue_page, False)),
        Route("/api/queues/{queue}", guard(api_queue, True)),
        Route("/api/queues/{queue}/backlog", guard(api_backlog, True)),
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
        Route("/queues/{queue}/jobs/{id}/{action}", writes.act, methods=["POST"]),
        Route("/api/queues/{queue}/jobs/{id}/{action}", writes.act, methods=["POST"]),
        Route("/queues/{queue}/{action}", writes.act, methods=["POST"]),
        Route("/api/queues/{queue}/{action}", writes.act, methods=["POST"]),
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
