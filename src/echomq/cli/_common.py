"""What every command shares: the main group, its server, its errors.

What every ``echomq`` command shares: the ``main`` group and its options, the server a
command talks to (``--url``, or a private embedded one), one clear line for each failure."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import redis
import redis.exceptions

from echomq import __version__, keyspace
from echomq.app import App
from echomq.client import connect as _connect
from echomq.client.locate import _redacted_text
from echomq.errors import (
    EchoMQError,
    InvalidArgument,
    MissingExtra,
    ServerNotRunning,
    ServerUnreachable,
)
from echomq.ops import snapshots as _inspect
from echomq.ops.records import _record_server, _unrecord
from echomq.protocol import extras as _extras
from echomq.queue import Queue
from echomq.server import EmbeddedServer, NoServerBinary, ServerStartError, state_dir

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = 2) -> None:
    """One line ``error: ...`` on stderr, no traceback, and exit ``code`` (2: the command
    could not run; 1: it ran and the answer is "no", e.g. a queue that does not exist)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _checked_queues(queues: tuple[str, ...]) -> None:
    """Every queue name given checked before anything is read or written."""
    for name in queues:
        try:
            keyspace.check_queue(name)
        except EchoMQError as exc:
            _fail(str(exc))


def _checked_url(url: str) -> str:
    try:
        return _connect.check_url(url)
    except InvalidArgument as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet


def _resolved(ctx: click.Context, app_url: str | None = None) -> _connect.Resolved:
    """``echomq.client.connect.resolve_url`` for a command: a recorded server that is gone is one
    ``error:`` line; with ``-v`` the server and where it came from are printed (once)."""
    try:
        found = _connect.resolve_url(ctx.obj.get("url"), app_url)
    except EchoMQError as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet
    if ctx.obj.get("verbose") and not ctx.obj.get("told"):
        ctx.obj["told"] = True
        click.echo(f"echomq: server {_shown(found.url)} ({found.source}: {found.reason})", err=True)
    return found


def _url(ctx: click.Context) -> str:
    """The server of an operator command (``echomq.client.connect.resolve_url``: ``--url``,
    ``ECHOMQ_URL``, a recorded ``echomq server``, the local default)."""
    return _checked_url(_resolved(ctx).url)


def _shown(url: str) -> str:
    """``url`` as printed: any password masked."""
    return _redacted_text(url)


@contextlib.contextmanager
def _errors(url: str) -> Iterator[None]:
    """Turn the usual failures into one clear line and a non-zero exit."""
    try:
        yield
    except ServerUnreachable as exc:  # names the server and the time it waited
        _fail(str(exc))
    except redis.exceptions.AuthenticationError as exc:  # a ConnectionError: test it first
        _fail(f"the server at {_shown(url)} refused the credentials: {exc}")
    except redis.exceptions.ConnectionError as exc:
        _fail(f"cannot reach the server at {_shown(url)}: {exc}")
    except redis.exceptions.ResponseError as exc:
        _fail(f"the server at {_shown(url)} answered an error: {exc}")
    except redis.exceptions.RedisClusterException as exc:  # e.g. no node of it answers
        _fail(f"cannot use the cluster at {_shown(url)}: {exc}")
    except EchoMQError as exc:
        _fail(str(exc))


@contextlib.contextmanager
def _server_for(
    ctx: click.Context,
    *,
    purpose: str,
    app_url: str | None = None,
    optional_module: Path | None = None,
) -> Iterator[str]:
    """The configured server (``--url``, then ``app_url`` — the loaded ``App(url=...)`` —,
    ``ECHOMQ_URL``, a recorded ``echomq server``), or when none is, a private embedded one
    for the duration of the command.
    ``optional_module``: a built trafikey to load if it can; a server that refuses it (a
    stale or foreign build) is started again without it, with a warning, on the Lua path."""
    try:
        if purpose == "demo":
            # The demo writes ~20k jobs and kills a worker: it runs on its own private server
            # unless one is named outright (--url, ECHOMQ_URL), never on a recorded
            # `echomq server` (the user's, holding their queues) it merely found here.
            named = ctx.obj.get("url") or os.environ.get("ECHOMQ_URL")
            found = _connect.configured(named) if named else None
        else:
            found = _connect.configured(ctx.obj.get("url"), app_url)
    except ServerNotRunning as exc:
        # A worker's own server died with that worker: this one starts its own (the same
        # data dir). A recorded `echomq server` that is down is the user's to start.
        if not (purpose == "worker" and exc.by == "worker"):
            _fail(str(exc))
        found = None
    if found is not None:
        # logs the choice
        chosen = _checked_url(_resolved(ctx, app_url).url)
        _hand_to_app(purpose, chosen)
        yield chosen
        return
    directory = state_dir() / purpose
    try:
        try:
            load = ["--loadmodule", str(optional_module)] if optional_module else []
            server = EmbeddedServer(directory, args=load).start()
        except ServerStartError as exc:
            if not optional_module:
                raise
            # The last log line says why, after its "pid:role date time #" prefix.
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "no reason given"
            why = re.sub(r"^\d+:[A-Z] .*? [.#*-] ", "", last)
            click.echo(
                f"echomq: the server would not load the module {optional_module} ({why}); "
                "running on the Lua executor (rebuild it: echomq module build)",
                err=True,
            )
            server = EmbeddedServer(directory).start()
    except NoServerBinary as exc:
        _fail(str(exc))
        raise  # unreachable; keeps type checkers quiet
    why = "the demo runs on its own server" if purpose == "demo" else "no server configured"
    click.echo(
        f"echomq: {why}; started an embedded one at {server.url} (data in {directory})",
        err=True,
    )
    # Recorded like `echomq server`'s, so producers (App()) and other commands run from this
    # directory find it while it lives; the record goes with it.
    record = _record_server(server, "worker") if purpose == "worker" else None
    _hand_to_app(purpose, server.url)
    try:
        yield server.url
    finally:
        server.stop()
        if record is not None:
            _unrecord(record, server)


def _hand_to_app(purpose: str, url: str) -> None:
    """The worker command hands its server to the App (``app.url = url``): named already (its
    source's line, or the embedded server's), it is not named again as App(url=...)."""
    if purpose == "worker":
        _connect.named(url, "app")


def _port_free(port: int) -> bool:
    """Whether the server could bind 127.0.0.1:``port`` now. SO_REUSEADDR as the server sets
    it: the connections of clients a stopped server left in TIME_WAIT do not hold the port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _queue(ctx: click.Context, name: str) -> Queue:
    url = _url(ctx)
    try:
        # An operator command fails fast with a clear line; it does not ride out outages.
        q = Queue(name, url=url, retry_for=0)
        # A sharded queue (issue 43) is operated as a whole: pause, drain, remove, cancel ...
        # act on every shard, and a queue-wide limit is refused (ShardsError) as the API does.
        n = len(q.shards())
        if n > 1:
            q.close()
            q = Queue(name, url=url, retry_for=0, shards=n)
        return q
    except EchoMQError as exc:
        _fail(str(exc))
        raise


def _run(ctx: click.Context, fn: Callable[[], Any]) -> Any:
    url = _url(ctx)
    with _errors(url):
        return fn()


def _existing(
    ctx: click.Context, name: str, *, create: bool = False, verb: str = "", q: Queue | None = None
) -> Queue:
    """The queue ``name`` (or ``q``) for an operator command; exit 1 when it does not exist
    on the server (a typo would otherwise act on a queue nobody uses), unless ``create``."""
    q = q if q is not None else _queue(ctx, name)
    if not create and not _run(ctx, lambda: _inspect.queue_exists(q.client, q.name)):
        hint = f" (--create {verb} it anyway)" if verb else ""
        _fail(f"queue {name!r} does not exist on {_shown(_url(ctx))}{hint}", code=1)
    return q


# The words other queues use for echomq's states, taken as aliases by every --state.
STATE_ALIASES = {"waiting": "pending", "delayed": "scheduled", "failed": "dead"}


def state_choice(states: tuple[str, ...]) -> click.Choice[str]:
    """A ``--state`` choice of ``states`` that also takes the aliases of those among them
    (waiting, delayed, failed); the command gets the canonical name (:func:`canonical`)."""
    aliases = [a for a, to in STATE_ALIASES.items() if to in states]
    return click.Choice([*states, *aliases])


def canonical(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A ``--state`` callback: an alias as the state it names."""
    return STATE_ALIASES.get(value, value)


def aliases_help(states: tuple[str, ...]) -> str:
    """The help text's note of the aliases a ``--state`` of ``states`` takes."""
    pairs = [f"{a} = {to}" for a, to in STATE_ALIASES.items() if to in states]
    return f" Aliases: {', '.join(pairs)}." if pairs else ""


_CREATE = click.option(
    "--create", is_flag=True, help="Act even when QUEUE does not exist yet (no keys on the server)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="ECHOMQ_URL", help="Server URL (redis://, rediss://, unix://). Env: ECHOMQ_URL."
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Print the server a command uses and where that choice came from.",
)
# The version the package itself holds, not the installed metadata: an editable install's
# metadata stays at the version it was installed with until pip runs again.
@click.version_option(version=__version__, prog_name="echomq")
@click.pass_context
def main(ctx: click.Context, url: str | None, verbose: bool) -> None:
    """echomq: a reliable job queue on Valkey/Redis."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    # Only a --url typed on the command line is "explicit": ECHOMQ_URL is found (and its
    # place in the order kept, after App(url=...)) by echomq.client.connect.resolve_url.
    source = ctx.get_parameter_source("url")
    ctx.obj["url"] = url if source is click.core.ParameterSource.COMMANDLINE else None


def _load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        _fail(f"expected MODULE:APP, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except MissingExtra as exc:  # e.g. App(serializer="msgpack") without the msgpack extra
        _fail(str(exc))
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            _fail(
                f"cannot import {module_name!r}: no module named {missing!r} (from {os.getcwd()})"
                + _as_module(module_name, attr)
            )
        _import_failed(module_name, exc)  # the module itself imports something missing
    except Exception as exc:  # the user's module raised while it was imported
        _import_failed(module_name, exc)
    name = attr or "app"
    apps = sorted(k for k, v in vars(module).items() if isinstance(v, App))
    has = f"; its echomq.App objects: {', '.join(apps)}" if apps else "; it has no echomq.App"
    if not hasattr(module, name):
        _fail(f"{module_name} has no attribute {name!r}{has}")
    obj = getattr(module, name)
    if not isinstance(obj, App):
        _fail(f"{module_name}:{name} is not an echomq.App (it is a {type(obj).__name__}){has}")
    assert isinstance(obj, App)
    return obj


def _as_module(module_name: str, attr: str) -> str:
    """A hint for a file path given where a module name goes (``tasks.py:app``,
    ``pkg/tasks.py``): the module it names, ``did you mean tasks:app?``."""
    path = module_name.replace("\\", "/")
    if not path.endswith(".py") and "/" not in path:
        return ""
    dotted = path.removesuffix(".py").strip("/").replace("/", ".")
    return f"; did you mean {dotted}:{attr or 'app'}?" if dotted else ""


def _import_failed(module_name: str, exc: BaseException) -> None:
    """The error is in the user's module: show where (its traceback), then one line."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:  # from the user's first frame on
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and not name.startswith("<frozen") and "importlib" not in name:
            break
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    _fail(f"importing {module_name!r} raised {type(exc).__name__}: {exc} (traceback above)")


def _needs_web(what: str, *modules: str) -> None:
    """One ``error:`` line naming the web extra when ``what`` cannot import ``modules`` (by
    default all of the extra's), before the command starts anything."""
    try:
        _extras.require("web", what, *modules)
    except MissingExtra as exc:
        _fail(str(exc))
