"""Where the server is: the state dir, the recorded server, the one URL every entry point uses.

:func:`resolve_url` is the one answer for ``Queue``, ``AsyncQueue``, ``App``, ``Worker`` and
the CLI (an explicit URL, ``App(url=...)``, ``ECHOMQ_URL``, a live ``echomq server`` recorded
in ``server.json`` of :func:`state_dir`, else the default local server). No network I/O but
one: a server recorded from another PID namespace is asked its ``run_id``.
:mod:`echomq.client.connect` re-exports these names; ``ops.records`` writes the record.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq.errors import InvalidArgument, ServerNotRunning

__all__ = [
    "CEILING_ENV",
    "DEFAULT_URL",
    "STATE_NAME",
    "Resolved",
    "configured",
    "default_url",
    "find_state_dir",
    "named",
    "pid_alive",
    "pid_namespace",
    "read_record",
    "recorded_url",
    "resolve_url",
    "run_id",
    "state_dir",
]

log = logging.getLogger("echomq")

DEFAULT_URL = "redis://127.0.0.1:6379/0"

# --------------------------------------------------------------------------- where the server is


class Resolved(NamedTuple):
    """The server a process uses: ``url``, ``source`` (``explicit``, ``app``, ``env``,
    ``recorded`` or ``default``) and a human ``reason``."""

    url: str
    source: str
    reason: str


STATE_NAME = ".echomq"
CEILING_ENV = "ECHOMQ_CEILING_DIRS"


def state_dir() -> Path:
    """The state dir (``server.json``, the embedded servers' data): ``ECHOMQ_HOME`` when set,
    else the nearest existing ``.echomq/`` directory found the way git finds ``.git``
    (:func:`find_state_dir`), else ``./.echomq`` (created there when first needed). A
    script run from a subdirectory of a project, or a server started in one, so uses the
    project's ``.echomq/`` and talks to the server recorded there."""
    home = os.environ.get("ECHOMQ_HOME")
    if home:
        return Path(home)
    try:
        found = find_state_dir(Path.cwd())
    except OSError:  # the cwd was deleted: nothing to walk from
        found = None
    return found or Path(STATE_NAME)


def find_state_dir(start: Path) -> Path | None:
    """The nearest ``.echomq/`` directory at or above ``start``: ``start`` itself first,
    then each parent. Like git's ``GIT_CEILING_DIRECTORIES``, the walk never looks in a
    ceiling or above it: the home directory (so ``~/.echomq`` is only used from ``~``
    itself), the filesystem root, and the absolute paths listed in ``ECHOMQ_CEILING_DIRS``
    (``os.pathsep``-separated). ``./.echomq`` is returned relative, as before; one found
    above ``start`` is absolute. None when there is none."""
    here = Path(os.path.abspath(start))
    ceilings = {Path(here.anchor)}
    with contextlib.suppress(RuntimeError, KeyError):
        ceilings.add(Path(os.path.abspath(Path.home())))
    for entry in os.environ.get(CEILING_ENV, "").split(os.pathsep):
        if entry and os.path.isabs(entry):
            ceilings.add(Path(os.path.abspath(entry)))
    if _is_dir(here / STATE_NAME):
        return Path(STATE_NAME)
    for parent in here.parents:
        if parent in ceilings:
            return None
        if _is_dir(parent / STATE_NAME):
            return parent / STATE_NAME
    return None


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, False for a directory this user may not look into."""
    try:
        return path.is_dir()
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0; another user's process counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_server_process(pid: int, port: int) -> bool:
    """The pid still runs the recorded server, not a process that reused its pid: its
    command line names the port (the server retitles itself ``redis-server host:port``; it
    was started with ``--port N``). Linux only; elsewhere a live pid is taken at its word."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return re.search(rb"(?<![0-9])%d(?![0-9])" % port, cmdline) is not None


def read_record(directory: Path | None = None) -> dict[str, Any] | None:
    """The parsed ``<state dir>/server.json``: ``{}`` when it exists but does not parse (or
    lacks pid, port or url), None when there is none."""
    record = (directory or state_dir()) / "server.json"
    try:
        text = record.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
        int(info["pid"]), int(info["port"]), str(info["url"])
    except (ValueError, KeyError, TypeError):
        return {}
    return info if isinstance(info, dict) else {}


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``), recorded beside a server's pid:
    a pid means something only in its own namespace. None where Linux does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def run_id(socket_path: str | None, url: str, timeout: float = 1.0) -> str | None:
    """The ``run_id`` the server at ``socket_path`` (when that file exists) or ``url``
    answers ``INFO server`` with: random per server start, so it names one server run.
    None when it does not answer within ``timeout``."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if socket_path and os.path.exists(socket_path):
        client = redis.Redis(unix_socket_path=socket_path, **options)
    else:
        client = redis.Redis.from_url(url, **options)
    try:
        found = client.info("server").get("run_id")
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
    return str(found) if found else None


def _live(info: dict[str, Any]) -> bool:
    pid, port = int(info["pid"]), int(info["port"])
    theirs, recorded_run = info.get("pidns"), info.get("run_id")
    if theirs and recorded_run and theirs != pid_namespace():
        # Recorded from another PID namespace (one container writes, another reads the
        # shared .echomq/): the pid names nothing here. The server is asked instead, and
        # only the run recorded counts, not a server started on the port since (issue 36).
        return run_id(info.get("socket"), str(info["url"])) == str(recorded_run)
    return pid_alive(pid) and _is_server_process(pid, port)


def recorded_url(directory: Path | None = None) -> str | None:
    """The URL of a live ``echomq server`` recorded in ``<state dir>/server.json``.

    No network I/O: the record is read and its pid checked alive (and, on Linux, still
    running the recorded port), so resolving a URL never waits on a server; except for a
    record written in another PID namespace (a container's), whose pid cannot be checked
    here: that server is asked its ``run_id`` (``INFO``, a 1 s timeout) and must answer the
    recorded one.
    """
    info = read_record(directory)
    if info and _live(info):
        return str(info["url"])
    return None


def configured(explicit: str | None = None, app_url: str | None = None) -> Resolved | None:
    """The server the user configured, or None when nothing is (see :func:`resolve_url`).
    A record of a server that is gone raises :class:`~echomq.errors.ServerNotRunning`: the
    user chose that server, and falling back to another (6379, maybe production) would
    hide that it is down."""
    for value in (explicit, app_url):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"url must be a str, got {type(value).__name__}")
    if explicit:
        return Resolved(explicit, "explicit", "passed explicitly")
    if app_url:
        return Resolved(app_url, "app", "App(url=...)")
    env = os.environ.get("ECHOMQ_URL")
    if env:
        return Resolved(env, "env", "ECHOMQ_URL")
    where = state_dir() / "server.json"
    info = read_record()
    if info is None:
        return None
    if not info or not _live(info):
        raise ServerNotRunning(str(where), str(info.get("by", "server")))
    return Resolved(str(info["url"]), "recorded", f"the live echomq server recorded in {where}")


_logged: set[tuple[str, str]] = set()  # (url, source) resolve_url has named in this process
_logged_lock = threading.Lock()


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _redacted_text(url: str) -> str:
    """``url`` with the password masked, even when it does not parse."""
    try:
        return _redacted(url)
    except ValueError:
        return re.sub(r":[^:@/]*@", ":***@", url)


def resolve_url(explicit: str | None = None, app_url: str | None = None) -> Resolved:
    """Which server to use, and why. The one answer for ``Queue``, ``AsyncQueue``, ``App``,
    ``Worker`` and the CLI; the first that applies wins:

    1. ``explicit``: a URL passed to the call (``Queue(url=...)``, ``Worker(url=...)``,
       ``echomq --url``);
    2. ``app_url``: ``App(url=...)``;
    3. the ``ECHOMQ_URL`` environment variable;
    4. a live ``echomq server`` recorded in ``server.json`` of :func:`state_dir`
       (``ECHOMQ_HOME``, else the nearest ``.echomq/`` at or above the current directory);
    5. ``redis://127.0.0.1:6379/0``, when nothing at all is configured.

    A record whose server is gone raises :class:`~echomq.errors.ServerNotRunning` instead
    of step 5. No network I/O (step 4 reads a file and checks a pid; only a server recorded
    from another PID namespace, whose pid is not visible here, is asked its ``run_id``).
    Each choice is logged once per process on the ``echomq`` logger, with any password
    masked: at INFO, and at WARNING for step 5 (a server nobody chose).
    """
    found = configured(explicit, app_url) or Resolved(
        DEFAULT_URL,
        "default",
        "nothing configured, no URL, ECHOMQ_URL or echomq server recorded in "
        f"{state_dir()}/: the default local server",
    )
    key = (found.url, found.source)
    with _logged_lock:
        first = key not in _logged
        _logged.add(key)
    if first:
        level = logging.WARNING if found.source == "default" else logging.INFO
        log.log(level, "echomq server %s (%s)", _redacted(found.url), found.reason)
    return found


def named(url: str, source: str) -> None:
    """Take ``url`` as named already from ``source``: :func:`resolve_url` does not name it
    so again. The CLI's worker named its server (where it came from, or the embedded one it
    started) and then hands it to the App, whose App(url=...) would name it a second time,
    with a reason that is not the real one."""
    with _logged_lock:
        _logged.add((url, source))


def default_url() -> str:
    """The server a call with no URL uses (:func:`resolve_url` with nothing passed)."""
    return resolve_url().url
