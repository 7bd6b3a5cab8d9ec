"""The dashboard's write side: sign-in and sign-out, and the actions (every POST).

An action is authenticated before its body is read (a bearer token, or a signed-in session
whose form carries the CSRF token matched against its cookie), a destructive one asks for
confirmation first, and the page it lands on says what was done once (a flash cookie).
``create_app`` (``echomq.web``) routes to a :class:`_Writes` made with its pages' helpers.
"""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from echomq.client.connect import TRANSIENT
from echomq.errors import InvalidArgument, InvalidId, JobGone, StateError
from echomq.web._session import _CSRF, _FLASH, _SESSION, MAX_FORM, _form, _https, _State, _TooLarge
from echomq.web.actions import (
    DESTRUCTIVE,
    JOB_ACTIONS,
    QUEUE_ACTIONS,
    _NoSuchRepeat,
    describe,
    perform,
)

__all__ = ["_FLASH_MAX", "_Writes"]

# A flash message's length at most (a cookie is a few KiB at most).
_FLASH_MAX = 500


class _Writes:
    """The POST endpoints of one dashboard, over its state and its pages' helpers: ``render``
    a template, answer an ``error`` (a page or JSON), answer a server that is
    ``unreachable`` (503), and whether a request is ``signed_in``."""

    def __init__(
        self,
        st: _State,
        render: Callable[..., HTMLResponse],
        error: Callable[[Request, int, str, bool], Response],
        unreachable: Callable[[Request, BaseException, bool], Response],
        signed_in: Callable[[Request], bool],
    ) -> None:
        self.st = st
        self.render = render
        self.error = error
        self.unreachable = unreachable
        self.signed_in = signed_in

    def _bearer(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        if not self.st.token or not auth.lower().startswith("bearer "):
            return False
        return hmac.compare_digest(auth[7:].strip().encode(), self.st.token.encode())

    async def login(self, request: Request) -> Response:
        base = request.scope.get("root_path", "")
        if request.method == "GET":
            return self.render(request, "login.html", failed=False)
        csrf_refused = "the form's CSRF token does not match: reload and retry"
        if not request.cookies.get(_CSRF):
            # No form of ours was served to this client: refused before its body is read.
            return self.error(request, 403, csrf_refused, False)
        try:
            form = await _form(request)
        except _TooLarge:
            return self.error(request, 413, f"a request body is at most {MAX_FORM} bytes", False)
        except InvalidArgument as exc:
            return self.error(request, 400, str(exc), False)
        if not self._csrf_ok(request, form):
            return self.error(request, 403, csrf_refused, False)
        given = str(form.get("token", ""))
        if not self.st.token or not hmac.compare_digest(given.encode(), self.st.token.encode()):
            return self.render(request, "login.html", status=403, failed=True)
        try:
            sid = self.st.sign_in()
        except TRANSIENT as exc:
            return self.unreachable(request, exc, False)
        response = RedirectResponse(base + "/", status_code=303)
        response.set_cookie(_SESSION, sid, httponly=True, samesite="strict", secure=_https(request))
        return response

    async def logout(self, request: Request) -> Response:
        # Revoked on the server: the cookie (or a copy of it) signs nobody in any more.
        try:
            self.st.sign_out(request.cookies.get(_SESSION))
        except TRANSIENT as exc:
            return self.unreachable(request, exc, False)
        response = RedirectResponse(request.scope.get("root_path", "") + "/", status_code=303)
        response.delete_cookie(_SESSION)
        return response

    def _csrf_ok(self, request: Request, form: Any) -> bool:
        cookie = request.cookies.get(_CSRF)
        sent = str(form.get("csrf", ""))
        return bool(cookie and sent and hmac.compare_digest(cookie.encode(), sent.encode()))

    async def act(self, request: Request) -> Response:
        api = request.url.path.startswith(request.scope.get("root_path", "") + "/api/")
        queue = request.path_params["queue"]
        job_id = request.path_params.get("id")
        action = request.path_params["action"]
        allowed = JOB_ACTIONS if job_id else QUEUE_ACTIONS
        if action not in allowed:
            return self.error(request, 404, f"unknown action {action!r}", api)
        if self.st.read_only:
            return self.error(request, 403, "the dashboard is read-only", api)
        if not self.st.token:
            return self.error(
                request, 403, "actions need ECHOMQ_DASHBOARD_TOKEN on the server", api
            )
        # Authenticated before the body is read: an anonymous client never gets it buffered.
        bearer = self._bearer(request)
        if not bearer and not self.signed_in(request):
            return self.error(request, 401, "sign in with the dashboard token first", api)
        try:
            form = await _form(request)
        except _TooLarge:
            return self.error(request, 413, f"a request body is at most {MAX_FORM} bytes", api)
        except InvalidArgument as exc:
            return self.error(request, 400, str(exc), api)
        # A script with the token sends no cookie, so it has no CSRF to guard against.
        if not bearer and not self._csrf_ok(request, form):
            return self.error(
                request, 403, "the form's CSRF token does not match: reload and retry", api
            )
        fields = {k: str(v) for k, v in form.items()}
        selected = form.every("ids")
        destructive = action in DESTRUCTIVE or (
            action == "selected" and fields.get("verb") in ("remove", "cancel")
        )
        if destructive and fields.get("confirm") != "yes":
            if api:
                return self.error(request, 409, f"{action} is destructive: send confirm=yes", api)
            return self.render(
                request,
                "confirm.html",
                queue=queue,
                job_id=job_id,
                action=action,
                fields={k: v for k, v in fields.items() if k not in ("csrf", "confirm", "ids")},
                selected=selected,
            )
        try:
            if not self.st.exists(queue):
                return self.error(request, 404, f"no such queue: {queue!r}", api)
            result = perform(self.st.client, self.st.app, queue, job_id, action, fields, selected)
        except (InvalidId, InvalidArgument) as exc:
            return self.error(request, 400, str(exc), api)
        except JobGone as exc:
            return self.error(request, 404, f"no such job: {exc}", api)
        except _NoSuchRepeat as exc:
            return self.error(request, 404, str(exc), api)
        except StateError as exc:
            return self.error(request, 409, str(exc), api)
        except TRANSIENT as exc:
            return self.unreachable(request, exc, api)
        self.st.forget()
        if api:
            return JSONResponse({"ok": True, "action": action, "result": result})
        said = describe(action, job_id, fields, selected, result)
        base = request.scope.get("root_path", "")
        target = f"{base}/queues/{queue}" + (f"/jobs/{job_id}" if job_id else "")
        if action in {"remove", "selected"} or action.endswith("_dead"):
            back = fields.get("back", "")
            # Only a path of this dashboard's queue page: never an open redirect.
            target = f"{base}/queues/{queue}" + (back if back.startswith("?") else "")
        elif action in ("unrepeat", "pause_repeat", "resume_repeat"):
            target = f"{base}/queues/{queue}/repeats"
        moved = RedirectResponse(target, status_code=303)
        # The page it lands on says what was done (a cookie: nothing in the URL to forge).
        moved.set_cookie(
            _FLASH,
            urllib.parse.quote(said[:_FLASH_MAX]),
            max_age=60,
            httponly=True,
            samesite="strict",
            secure=_https(request),
        )
        return moved
