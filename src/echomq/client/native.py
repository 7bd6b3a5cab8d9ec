"""The trafikey module: which verbs it runs, detecting it, building it.

The native executor: which transitions the ``trafikey`` server module runs, whether a
server has it, and how to build it.

``trafikey`` (C, ``native/`` of the repository, shipped in the wheel as ``echomq/native/``)
registers ``EMQ.*`` commands that take a script's keys and arguments with EVAL's convention
(``EMQ.<VERB> numkeys key... arg...``) and reply byte-identically, so the decoders of
``protocol.calls`` serve both executors. This module is the one place that knows:

- :data:`TWINS`: the scripts that have a native twin (every other script runs as Lua);
- :func:`resolve_executor`: which executor a queue asked for (argument, URL, env, ``auto``);
- :func:`module_list_nodes` and :func:`decide_from`: the ``MODULE LIST`` exchange (sent by
  the executors at the first connect) that decides ``auto``, and refuses ``native`` on a
  server without the module;
- :func:`build`: compiling the C source into a user cache dir (never into site-packages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from echomq.errors import ExecutorUnavailable, InvalidArgument
from echomq.protocol import scripts as _scripts

__all__ = [
    "EXECUTORS",
    "MODULE_NAME",
    "MODULE_VERSION",
    "TWINS",
    "ModuleBuildError",
    "build",
    "built_module",
    "cache_dir",
    "check_executor",
    "decide",
    "resolve_executor",
    "source_dir",
    "unknown_command",
    "url_executor",
]

MODULE_NAME = "trafikey"
# The module's integer version as MODULE LIST reports it; a server with another version is
# not used (its commands may take other arguments or reply differently).
MODULE_VERSION = 4

# Script name -> native command, derived from the scripts' headers (their ``Native:`` line,
# _scripts.TWINS): a script without one (reap, promote, the admin verbs ...) runs as Lua.
TWINS: dict[str, str] = _scripts.TWINS

EXECUTORS = ("auto", "lua", "native")
ENV = "ECHOMQ_EXECUTOR"


# --------------------------------------------------------------------------- which executor


def check_executor(value: object, where: str = "executor") -> str:
    """``value`` if it names an executor; ``InvalidArgument`` otherwise (before any I/O)."""
    if not isinstance(value, str) or value.lower() not in EXECUTORS:
        raise InvalidArgument(
            f"{where} must be one of {', '.join(map(repr, EXECUTORS))}, got {value!r}"
        )
    return value.lower()


def url_executor(url: str | None) -> str | None:
    """The URL's ``executor=`` option, checked; None when absent."""
    if not url:
        return None
    found = [
        v for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if k == "executor"
    ]
    return check_executor(found[-1], "the URL's executor= option") if found else None


def resolve_executor(explicit: str | None = None, url: str | None = None) -> str:
    """The executor asked for: ``explicit`` > the URL's ``executor=`` > ``ECHOMQ_EXECUTOR`` >
    ``"auto"``. Every value met is checked, so a bad one fails even when a later one wins."""
    chosen = check_executor(explicit) if explicit is not None else None
    from_url = url_executor(url)
    env = os.environ.get(ENV)
    from_env = check_executor(env, ENV) if env else None
    return chosen or from_url or from_env or "auto"


# --------------------------------------------------------------------------- is it loaded


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def loaded_version(reply: Any) -> int | None:
    """The version of ``trafikey`` in one server's MODULE LIST reply; None when absent.
    Accepts the raw RESP2 reply (a list of flat name/value lists) and redis-py's parsed one
    (a list of dicts)."""
    for entry in reply or ():
        if isinstance(entry, dict):
            fields = {_text(k): v for k, v in entry.items()}
        else:
            flat = list(entry)
            fields = {_text(k): v for k, v in zip(flat[::2], flat[1::2], strict=False)}
        if _text(fields.get("name", "")) == MODULE_NAME:
            try:
                return int(fields.get("ver", -1))
            except (TypeError, ValueError):
                return -1
    return None


MODULE_LIST = ("MODULE", "LIST")


def module_list_nodes(client: Any, cluster: bool) -> dict[str, Any]:
    """execute_command's node choice for MODULE LIST: every primary on a cluster (a node
    flag is not honoured for every command by redis-py's cluster clients), else none."""
    return {"target_nodes": client.get_primaries()} if cluster else {}


def decide_from(mode: str, raw: Any) -> bool:
    """:func:`decide` on what MODULE LIST gave: the error reply it raised, a cluster's
    ``{node: reply}`` (one reply per primary), or one server's reply."""
    if isinstance(raw, BaseException):
        return decide(mode, None, raw)
    if isinstance(raw, dict):
        return decide(mode, list(raw.values()), names=[_text(name) for name in raw])
    return decide(mode, [raw])


def decide(
    mode: str,
    replies: list[Any] | None,
    refused: BaseException | None = None,
    names: list[str] | None = None,
) -> bool:
    """Whether the native executor serves: ``replies`` holds one MODULE LIST reply per
    primary (None, with ``refused``, when the server would not answer it; ``names`` the
    primaries, on a cluster). ``auto`` falls back to Lua; ``native`` raises
    :class:`ExecutorUnavailable` saying what is missing, and where."""
    if mode == "lua":
        return False
    if replies is None:
        if mode == "native":
            raise ExecutorUnavailable(
                f"executor='native' but the server refused MODULE LIST ({refused}); "
                "cannot tell whether trafikey is loaded"
            )
        return False
    versions = [loaded_version(r) for r in replies]
    ok = bool(versions) and all(v == MODULE_VERSION for v in versions)
    if not ok and mode == "native":
        raise ExecutorUnavailable(
            f"executor='native' but {_missing(versions, names)}; start "
            f"{'every primary' if names else 'the server'} with --loadmodule <path printed "
            "by `echomq module build`>, or use executor='auto'"
        )
    return ok


def _missing(versions: list[int | None], names: list[str] | None) -> str:
    """What keeps the native executor out: the servers without the module, and those with
    another version than :data:`MODULE_VERSION` (named on a cluster)."""
    if not names:
        found = [v for v in versions if v is not None]
        if not found:
            return "the server does not load the trafikey module"
        return f"the server loads trafikey version {found[0]}, this client needs {MODULE_VERSION}"
    parts = []
    absent = [n for n, v in zip(names, versions, strict=False) if v is None]
    if absent:
        which = "primary" if len(absent) == 1 else "primaries"
        parts.append(
            f"the {which} {', '.join(absent)} {'does' if len(absent) == 1 else 'do'} not "
            "load the trafikey module"
        )
    for name, v in zip(names, versions, strict=False):
        if v is not None and v != MODULE_VERSION:
            parts.append(f"{name} loads trafikey version {v} (this client needs {MODULE_VERSION})")
    return " and ".join(parts) or "no primary answered MODULE LIST"


def unknown_command(exc: BaseException) -> bool:
    """Whether an error reply is a server refusing an ``EMQ.*`` command it does not know
    (a server without the module: e.g. a replica without it was promoted). The command did
    not run, so the call may be sent again as its script."""
    text = str(exc).lower()
    return "unknown command" in text and "emq." in text


# --------------------------------------------------------------------------- building it


class ModuleBuildError(RuntimeError):
    """The C module could not be built (no source, no compiler, a failed make)."""


def source_dir() -> Path:
    """The module's C source: ``echomq/native/`` in an installed wheel, else the checkout's
    ``native/`` (``src/echomq/client/native.py`` -> ``<repo>/native``)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "native", here.parent.parent / "native"):
        if (candidate / "Makefile").is_file():
            return candidate
    looked = f"{here / 'native'} and {here.parent.parent / 'native'}"
    raise ModuleBuildError(f"no trafikey source found (looked in {looked})")


def cache_dir() -> Path:
    """Where ``echomq module build`` puts the module by default:
    ``$XDG_CACHE_HOME/echomq/trafikey-<version>`` (``~/.cache`` when XDG_CACHE_HOME is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "echomq" / f"{MODULE_NAME}-{MODULE_VERSION}"


def built_module(dest: str | os.PathLike[str] | None = None) -> Path | None:
    """The built module in ``dest`` (default :func:`cache_dir`), or None when not built."""
    path = Path(dest or cache_dir()) / f"{MODULE_NAME}.so"
    return path.resolve() if path.is_file() else None


def build(dest: str | os.PathLike[str] | None = None) -> Path:
    """Compile the module into ``dest`` (default :func:`cache_dir`) and return the absolute
    path of ``trafikey.so``. The source is copied to a temp dir and built there: the package
    directory (site-packages) is never written to."""
    # native/Makefile compiles with gcc and nothing else (no server headers needed).
    missing = [tool for tool in ("make", "gcc") if shutil.which(tool) is None]
    if missing:
        raise ModuleBuildError(
            f"building trafikey needs {' and '.join(missing)}: install them "
            "(Debian/Ubuntu: sudo apt-get install -y build-essential)"
        )
    src = source_dir()
    out_dir = Path(dest or cache_dir()).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="echomq-trafikey-") as tmp:
        work = Path(tmp) / "native"
        # Objects left over in a checkout may come from another compiler or flags: rebuild.
        shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.so", "*.o", "*.d"))
        done = subprocess.run(
            ["make", "-C", str(work)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        built = work / f"{MODULE_NAME}.so"
        if done.returncode != 0 or not built.is_file():
            tail = (done.stdout + done.stderr).strip()[-2000:]
            raise ModuleBuildError(
                f"make failed (exit {done.returncode}) in a copy of {src}:\n{tail}"
            )
        # Copied under a temporary name and renamed: a server loading the old file never
        # sees a half-written one.
        target = out_dir / f"{MODULE_NAME}.so"
        partial = out_dir / f".{MODULE_NAME}.so.{os.getpid()}"
        shutil.copy2(built, partial)
        partial.replace(target)
    return target
