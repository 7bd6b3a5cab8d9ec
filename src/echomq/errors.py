"""The one exception tree of echomq, and the one mapper from a server reply to it.

::

    EchoMQError
    ├── InvalidId           (also ValueError)  malformed id, queue or lane name; before any I/O
    ├── InvalidArgument     (also ValueError)  bad lease, count, state, ...; before any I/O
    ├── PayloadTooLarge     (also ValueError)  payload over the configured maximum; before any I/O
    ├── BadArguments        (also TypeError)  a task call that does not fit the handler, or an
    │                       argument with no serializable form; before any I/O
    ├── KindError           EMQKIND   a non-JOB id in the job position
    ├── StaleToken          EMQSTALE  the token no longer owns the job
    ├── JobGone             the row does not exist (completed, removed, never enqueued)
    ├── JobFailed           ``wait()`` (or ``App.result``) on a dead-lettered job; ``.error``
    │   └── ChainFailed     a chain's step died: ``.step`` (its index), ``.job_id``, ``.error``
    ├── GroupFailed         a group's (or chord's) members died: every failure in ``.exceptions``
    ├── ResultNotReady      ``App.result``: the job has not finished yet; ``.state``
    ├── ResultNotKept       ``App.result``: no outcome is kept for the job (its task keeps none,
    │                       it expired, or no such job)
    ├── StateError          EMQSTATE  e.g. reprocess of a job that is not dead; ``.reason``
    ├── Locked              EMQLOCK   remove/cancel of a job whose ``:lock`` key exists (reserved:
    │                                 nothing in echomq writes that key)
    ├── RateLimited         EMQRATE   reserved: no script sends it (rate limits delay, D21)
    ├── ProtocolError       an unknown EMQ* class word; carries the text
    ├── DurabilityError     durable mode: the write applied, too few replicas acknowledged it
    ├── ServerUnreachable   (also ``redis.ConnectionError`` and ``ConnectionError``) the
    │                       server stayed unreachable for the whole ``retry_for``
    ├── VersionFenceError   ``{emq}:version`` holds another wire version
    │   └── LayoutFenceError  ``{emq}:layout`` holds a data layout this release does not
    │                         serve; the one line says what to upgrade
    ├── ServerNotRunning    nothing else configured, and the ``echomq server`` recorded in
    │                       the state dir (``.echomq/server.json``) is not running: raised
    │                       where the URL is resolved, never a silent fallback to 6379
    ├── ExecutorUnavailable executor="native" on a server without the trafikey module (or
    │                       another version of it); raised at the first connect
    └── MissingExtra        (also ``ImportError``) a feature of an optional extra (msgpack,
                            otel, web) used without it installed; names what to install

Other connection errors of the driver (``redis.TimeoutError``, a ``redis.ConnectionError`` of
a call that is never resent ...) propagate unchanged.
"""

from __future__ import annotations

import redis.exceptions

__all__ = [
    "BadArguments",
    "ChainFailed",
    "DurabilityError",
    "EchoMQError",
    "ExecutorUnavailable",
    "GroupFailed",
    "InvalidArgument",
    "InvalidId",
    "JobFailed",
    "JobGone",
    "KindError",
    "LayoutFenceError",
    "Locked",
    "MissingExtra",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimited",
    "ResultNotKept",
    "ResultNotReady",
    "ServerNotRunning",
    "ServerUnreachable",
    "ShardsError",
    "StaleToken",
    "StateError",
    "VersionFenceError",
    "from_reply",
]


class EchoMQError(Exception):
    """Base of everything echomq raises."""


class InvalidId(EchoMQError, ValueError):
    """A malformed branded id, queue name or lane name. Raised before any I/O."""


class InvalidArgument(EchoMQError, ValueError):
    """A malformed argument (lease, count, delay, state name ...). Raised before any I/O."""


class ShardsError(InvalidArgument):
    """A verb a sharded queue (``Queue(name, shards=N)``, N > 1) cannot keep exact, or a
    shrink of its layout; the message names the rule and the alternative. Nothing written."""


class PayloadTooLarge(EchoMQError, ValueError):
    """The payload is larger than the queue's ``max_payload``; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload is {size} bytes, over the maximum of {limit} bytes")
        self.size = size
        self.limit = limit


class _WireError(EchoMQError):
    """A refusal the server sent as an error reply led by a class word."""

    word = ""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
        head, _, rest = text.partition(" ")
        self.reason = rest if head.startswith("EMQ") else text


class KindError(_WireError):
    """``EMQKIND``: a non-``JOB`` id in the job position."""

    word = "EMQKIND"


class StaleToken(_WireError):
    """``EMQSTALE``: the token no longer owns the job (another lease generation, or settled)."""

    word = "EMQSTALE"


class StateError(_WireError):
    """``EMQSTATE``: the job or queue is not in the state the verb needs; see ``.reason``."""

    word = "EMQSTATE"


class Locked(_WireError):
    """``EMQLOCK``: the job is locked. ``remove`` and ``cancel`` refuse a job whose
    ``job:<id>:lock`` key exists; nothing in echomq writes that key, so this is reserved."""

    word = "EMQLOCK"


class RateLimited(_WireError):
    """``EMQRATE``: a rate or concurrency ceiling refused the call. Reserved: no script sends
    it; rate limits (D21) hold lanes back inside the claim instead of refusing a call."""

    word = "EMQRATE"


class ProtocolError(_WireError):
    """An ``EMQ*`` class word this client does not know; ``.text`` holds the reply."""


class JobGone(EchoMQError):
    """The job's row does not exist: completed, removed, or never enqueued."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} is gone")
        self.job_id = job_id


class JobFailed(EchoMQError):
    """``wait()`` on a job that was dead-lettered (D17); ``.error`` holds its last error."""

    def __init__(self, job_id: str, error: str) -> None:
        super().__init__(f"job {job_id} failed: {error}")
        self.job_id = job_id
        self.error = error


class ChainFailed(JobFailed):
    """A chain's ``wait()``: step ``.step`` (0-based, in the chain's order) died, so the steps
    after it never ran. ``.job_id`` and ``.error`` are that step's (for a chord step, the
    first member that died); ``.ids`` are every step's ids, in order."""

    def __init__(self, step: int, job_id: str, error: str, ids: list[str]) -> None:
        super().__init__(job_id, error)
        self.args = (f"chain step {step} (job {job_id}) failed: {error}",)
        self.step = step
        self.ids = ids


class GroupFailed(EchoMQError):
    """A group's (or a chord's) ``wait()``: some members died. Every failure is attached, in
    the group's order: ``.exceptions`` (one :class:`JobFailed` each, like an
    ``ExceptionGroup``'s), ``.failed_ids``, and ``.values`` (every member's value, ``None``
    where it died)."""

    def __init__(self, failures: list[JobFailed], values: list[object]) -> None:
        ids = ", ".join(f.job_id for f in failures)
        super().__init__(f"{len(failures)} of {len(values)} group members failed: {ids}")
        self.exceptions = tuple(failures)
        self.failed_ids = [f.job_id for f in failures]
        self.values = values


class ResultNotReady(EchoMQError):
    """``App.result`` on a job that has not finished: ``.state`` says where it is
    (``pending``, ``active``, ``scheduled`` — backing off before a retry too —,
    ``awaiting_children``, or ``unknown``)."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(f"job {job_id} has not finished yet (it is {state})")
        self.job_id = job_id
        self.state = state


class ResultNotKept(EchoMQError):
    """``App.result`` on a job with no kept outcome: it finished but its task keeps no
    results (``keep_result_ms``), its result outlived its TTL, or there is no such job —
    the server cannot tell these apart once the row is gone."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"no result is kept for job {job_id}: its task keeps none (keep_result_ms), it "
            "expired, or there is no such job"
        )
        self.job_id = job_id


class DurabilityError(EchoMQError):
    """Durable mode: the write APPLIED on the primary, but fewer replicas than required
    acknowledged it in time (it may be lost if the primary fails before they catch up).

    - ``.reply``: what the call answered, decoded as the verb returns it (an enqueue's
      status, a settle's ``Settled`` with the jobs it claimed, ...). The write happened:
      act on it (a worker runs or hands back the jobs a settle claimed).
    - ``.job_id``: the job the call named (an enqueue's id, minted or given), else None.
    - ``.acked`` / ``.wanted``: the acknowledgements received and required.

    Retrying an enqueue is safe with the SAME id: ``queue.enqueue(payload, id=err.job_id)``
    answers ``duplicate`` while the job exists, never a second job (retrying without the id
    would mint a new one). A settle whose first attempt landed is refused on retry (the
    token fence answers gone or stale)."""

    def __init__(
        self, acked: int, wanted: int, *, reply: object = None, job_id: str | None = None
    ) -> None:
        text = f"{acked} of {wanted} replicas acknowledged the write (it applied)"
        if job_id is not None:
            text += f"; job {job_id}"
        super().__init__(text)
        self.acked = acked
        self.wanted = wanted
        self.reply = reply
        self.job_id = job_id


class ServerUnreachable(EchoMQError, redis.exceptions.ConnectionError, ConnectionError):
    """The server could not be reached for the whole retry budget (``retry_for``).

    Raised in place of the driver's ``redis.ConnectionError`` when a call that may be resent
    gave up; it is still one (and a builtin ``ConnectionError``), so handlers of either keep
    working. ``.url`` is the server (password masked), ``.waited_s`` how long the call kept
    trying, ``.retry_for`` its budget; the driver's error is ``__cause__``."""

    def __init__(self, url: str, waited_s: float, retry_for: float, cause: object = None) -> None:
        if retry_for > 0:
            how = f"gave up after {waited_s:.1f} s of retries (retry_for={retry_for:g})"
        else:
            how = "not retried (retry_for=0)"
        text = f"cannot reach the server at {url}: {how}"
        if cause is not None:
            text += f"; last error: {cause}"
        super().__init__(text)
        self.url = url
        self.waited_s = waited_s
        self.retry_for = retry_for


class VersionFenceError(EchoMQError):
    """``{emq}:version`` holds a wire version other than this client's."""

    def __init__(self, found: str, expected: str) -> None:
        super().__init__(
            f"{{emq}}:version holds {found!r} but this client speaks {expected!r}; "
            "refusing to serve a foreign deployment"
        )
        self.found = found
        self.expected = expected


class LayoutFenceError(VersionFenceError):
    """``{emq}:layout`` holds a data layout outside the ``min..own`` this client serves
    (issue 39, docs/guides/upgrading.md). ``.found`` is the recorded value (text),
    ``.expected`` this client's layout, ``.oldest`` the oldest it serves."""

    def __init__(self, found: str, layout: int, oldest: int) -> None:
        from echomq import __version__

        serves = f"{oldest}..{layout}" if oldest != layout else str(layout)
        if not found.isdigit():
            what = f"{{emq}}:layout holds {found!r}, not a data layout number"
            todo = "restore it (docs/guides/upgrading.md)"
        elif int(found) > layout:
            what = f"the deployment's data layout is {found}"
            todo = f"upgrade echomq on this host to a release that serves layout {found}"
        else:
            what = f"the deployment's data layout is {found}"
            todo = (
                "migrate it first with `echomq migrate` of a release that serves it "
                "(docs/guides/upgrading.md)"
            )
        EchoMQError.__init__(self, f"{what}; echomq {__version__} serves layouts {serves}: {todo}")
        self.found = found
        self.expected = str(layout)
        self.oldest = oldest


class ServerNotRunning(EchoMQError):
    """The state dir records an ``echomq server`` (``server.json``) whose process is gone.
    ``.record`` is the record's path, ``.by`` who wrote it (``"server"`` for ``echomq
    server``, ``"worker"`` for a worker's own embedded server)."""

    def __init__(self, record: str, by: str = "server") -> None:
        self.record = record
        self.by = by
        where = record.rsplit("/", 1)[0] if "/" in record else "."
        super().__init__(
            f"the echomq server recorded in {where}/ is not running: start it with "
            f"`echomq server` (or delete {record} to stop using it)"
        )


class ExecutorUnavailable(EchoMQError):
    """``executor="native"`` was asked for, and the server does not load the ``trafikey``
    module at the version this client speaks (or refuses ``MODULE LIST``), or a primary
    answered an ``EMQ.*`` command as unknown (a replica without the module was promoted).
    The message names the server or primaries."""


class MissingExtra(EchoMQError, ImportError):
    """A feature of an optional extra was used and the extra is not installed: the message is
    one line naming the extra to install (``pip install 'echomq[web]'``). ``.extra`` is its
    name (``msgpack``, ``otel``, ``web``), ``.module`` the module that is missing. Also an
    ``ImportError``, which is what ``import echomq.web`` raised before it said why."""

    def __init__(self, extra: str, feature: str, module: str) -> None:
        self.extra = extra
        self.feature = feature
        self.module = module
        super().__init__(
            f"{feature} needs the {extra} extra (no module named {module!r}): "
            f"pip install 'echomq[{extra}]' (from a clone of the repository: "
            f"pip install '.[{extra}]')",
            name=module,
        )

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str, str, str]]:
        # Pickled by its fields (a handler's error crosses from a process-pool child).
        return (MissingExtra, (self.extra, self.feature, self.module))


_BY_WORD: dict[str, type[_WireError]] = {
    cls.word: cls for cls in (KindError, StaleToken, StateError, Locked, RateLimited)
}


def from_reply(text: str) -> EchoMQError | None:
    """Map an error reply's text to its exception; ``None`` when it is not an echomq refusal.

    This is the only mapper: the EVALSHA path, the EVAL-after-NOSCRIPT path, pipelines and
    the native module all call it, so one reply always becomes the same exception.
    """
    word = text.split(" ", 1)[0]
    cls = _BY_WORD.get(word)
    if cls is not None:
        return cls(text)
    if word.startswith("EMQ"):
        return ProtocolError(text)
    return None


class BadArguments(EchoMQError, TypeError):
    """A task call whose arguments do not bind to the handler's signature, or an argument
    that cannot be serialized (the message names it); raised by ``Task.enqueue`` and its
    variants before anything is written. In the worker, a payload whose arguments do not
    fit (or do not convert to the handler's annotations) dead-letters its job with this
    error's text, after one attempt."""
