"""The dashboard's sessions, forms and cookies.

The dashboard's sessions and forms: the shared state (sessions with a TTL, revoked on
sign-out; the queue names; the sampled series), the form reader that refuses a body past
:data:`MAX_FORM` before buffering it, and the cookie names."""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request

from echomq import keyspace
from echomq.client.executor import SyncExecutor
from echomq.errors import (
    InvalidArgument,
)
from echomq.ops import snapshots as _inspect

_SESSION = "echomq_session"


_CSRF = "echomq_csrf"
# The message of the last action (percent-encoded), shown once by the next page it lands on.
_FLASH = "echomq_flash"


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
        return _inspect.typed_keys_exist(self.client, name) or name in self.names()

    def sample(self, view: _inspect.QueueView) -> None:
        minute = view.now_ms // 60_000
        depth = view.counts.get("pending", 0)
        with self._lock:
            points = self.samples.setdefault(view.name, collections.OrderedDict())
            points[minute] = (depth, view.oldest_waiting_age_s)
            while points and next(iter(points)) <= minute - 60:
                points.popitem(last=False)


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
