"""The code blocks of README.md, docs/SCALING.md and docs/guides/*.md, and the driver that
runs one document's blocks in order, as a user pastes them (test_docs_run.py runs it in a
subprocess).

The convention, which docs/guides/contributing-docs.md explains to writers: every fenced
block has a language. A ``python``, ``bash`` or ``sh`` block runs, unless the line right above
its fence is a marker (an HTML comment, invisible on GitHub):

- ``<!-- excerpt: REASON -->``: not run; the reason says why (it installs something, starts a
  process that never ends, is a fragment of a larger program, needs a service we do not run).
- ``<!-- run: OPTION ... -->``: run, with options (shell-quoted ``key=value`` or bare flags):
  ``file=PATH`` writes the block to PATH in the document's directory instead of running it
  (later blocks import it, a worker loads it); ``setup=CODE`` runs that Python first, in the
  same namespace (for what the prose around the block says it assumes); ``expect=TEXT``: the
  block's output must contain TEXT; ``terminals``: a shell block whose lines are separate
  terminals: every line but the last keeps running in the background until the document
  ends, the last runs in the foreground; ``worker=MODULE:APP``: a Python block runs while
  ``echomq worker MODULE:APP`` runs in the background; a bare ``worker``: while an
  ``echomq.Worker`` of the namespace's ``app`` serves its queues in a thread of the same
  process (what ``echomq worker`` in another terminal does for the reader; the tasks the
  block defines exist only in its namespace, so no worker process could import them).

Blocks of other languages (``ini``, ``yaml``, ``dockerfile``, ``text``) are files to read,
not code to run, and are never run.

Python blocks of one document share one namespace (and one event loop: a top-level ``await``
runs as in ``python -m asyncio``); shell blocks run with ``bash -e`` in the same directory,
with the venv's ``bin`` first on PATH and ``ECHOMQ_URL`` pointing at the test's server.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RUN_LANGS = frozenset({"python", "bash", "sh"})
READ_LANGS = frozenset({"ini", "yaml", "dockerfile", "text", "toml", "json"})
FENCE = re.compile(r"^(```|~~~)\s*([A-Za-z0-9_+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(excerpt|run)\s*:(.*?)-->\s*$")
OPTIONS = frozenset({"file", "setup", "expect", "terminals", "timeout", "worker"})


@dataclass
class Block:
    doc: str  # the document's path, relative to the repository
    line: int  # the line of the opening fence (1-based)
    lang: str
    code: str
    kind: str = "run"  # "run" or "excerpt"
    reason: str = ""  # an excerpt's reason
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


class MarkupError(ValueError):
    """A block or marker that breaks the convention."""


def parse(path: Path, root: Path) -> list[Block]:
    """Every fenced block of one Markdown file, with the marker above it (if any)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = str(path.relative_to(root))
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise MarkupError(f"{doc}:{start + 1}: a fence that is never closed")
        i += 1
        block = Block(doc, start + 1, lang, "\n".join(body) + "\n")
        above = lines[start - 1].strip() if start > 0 else ""
        mark = MARKER.match(above)
        if mark:
            block.kind = mark.group(1)
            text = mark.group(2).strip()
            if block.kind == "excerpt":
                block.reason = text
            else:
                block.options = _options(text, block.where)
        blocks.append(block)
    return blocks


def _options(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in shlex.split(text):
        key, _, value = token.partition("=")
        if key not in OPTIONS:
            raise MarkupError(f"{where}: unknown run option {key!r} (known: {sorted(OPTIONS)})")
        out[key] = value
    return out


def problems(blocks: list[Block]) -> list[str]:
    """Blocks that break the convention: no language, an unknown one, an excerpt without a
    reason, a run marker on a block that cannot run."""
    found = []
    for b in blocks:
        if not b.lang:
            found.append(f"{b.where}: a block without a language (python, bash, text, ...)")
        elif b.lang not in RUN_LANGS | READ_LANGS:
            found.append(f"{b.where}: unknown block language {b.lang!r}")
        elif b.kind == "excerpt" and not b.reason:
            found.append(f"{b.where}: an excerpt marker needs a reason: <!-- excerpt: why -->")
        elif b.lang in READ_LANGS and (b.options or b.kind == "excerpt"):
            found.append(f"{b.where}: a {b.lang} block is never run: it takes no marker")
        elif "terminals" in b.options and b.lang == "python":
            found.append(f"{b.where}: `terminals` is for shell blocks")
    return found


def runnable(blocks: list[Block]) -> list[Block]:
    return [b for b in blocks if b.lang in RUN_LANGS and b.kind == "run"]


# --------------------------------------------------------------------------- the driver
# Runs in a subprocess: `python docblocks.py steps.json`, cwd = the document's directory.


class BlockFailed(Exception):
    pass


@contextlib.contextmanager
def _worker_beside(ns: dict[str, Any]) -> Iterator[None]:
    import echomq

    worker = echomq.Worker(ns["app"])
    ready = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    def serve() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        ready.set()
        loop.run_until_complete(worker.arun())
        loop.close()

    thread = threading.Thread(target=serve, name="doc-worker", daemon=True)
    thread.start()
    ready.wait()
    try:
        yield
    finally:
        loops[0].call_soon_threadsafe(worker.stop)
        thread.join(60)
        if thread.is_alive():
            raise BlockFailed("the block's worker did not stop within 60 s")


def _run_python(b: Block, ns: dict[str, Any], loop: asyncio.AbstractEventLoop) -> str:
    spec = b.options.get("worker")
    if spec:  # worker=module:app: the command a reader runs in another terminal
        proc = subprocess.Popen(["echomq", "worker", spec], start_new_session=True)
        try:
            return _run_python_code(b, ns, loop)
        finally:
            _stop([proc])
    if spec is not None:
        with _worker_beside(ns):
            return _run_python_code(b, ns, loop)
    return _run_python_code(b, ns, loop)


def _run_python_code(b: Block, ns: dict[str, Any], loop: asyncio.AbstractEventLoop) -> str:
    out = io.StringIO()
    for source, line in ((b.options.get("setup"), b.line), (b.code, b.line)):
        if not source:
            continue
        # Padded so a traceback names the document's own line numbers.
        code = compile("\n" * line + source, b.doc, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        with contextlib.redirect_stdout(out):
            if code.co_flags & inspect.CO_COROUTINE:
                loop.run_until_complete(eval(code, ns))
            else:
                exec(code, ns)
    text = out.getvalue()
    sys.stdout.write(text)
    return text


def _run_shell(b: Block, env: dict[str, str], background: list[subprocess.Popen[bytes]]) -> str:
    timeout = float(b.options.get("timeout", "60"))
    if "terminals" in b.options:
        lines = [ln for ln in b.code.splitlines() if ln.strip()]
        for ln in lines[:-1]:
            print(f"$ {ln} &", flush=True)
            background.append(
                subprocess.Popen(["bash", "-e", "-c", ln], env=env, start_new_session=True)
            )
        script = lines[-1] + "\n"
    else:
        script = b.code
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        check=False,  # the exit status is reported with the block's output
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    sys.stdout.write(done.stdout)
    sys.stdout.write(done.stderr)
    if done.returncode != 0:
        raise BlockFailed(f"exited {done.returncode}")
    return done.stdout + done.stderr


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):  # the last started (a worker) before the first (its server)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def to_json(blocks: list[Block]) -> str:
    return json.dumps([asdict(b) for b in blocks])


def drive(steps: list[Block]) -> int:
    ns: dict[str, Any] = {"__name__": "__main__"}
    env = dict(os.environ)
    background: list[subprocess.Popen[bytes]] = []
    loop = asyncio.new_event_loop()
    sys.path.insert(0, os.getcwd())  # blocks written with file= import as a user's would
    try:
        for b in steps:
            print(f"----- {b.where} ({b.lang})", flush=True)
            if "file" in b.options:
                target = Path(b.options["file"])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(b.code, encoding="utf-8")
                continue
            try:
                if b.lang == "python":
                    out = _run_python(b, ns, loop)
                else:
                    out = _run_shell(b, env, background)
                want = b.options.get("expect")
                if want is not None and want not in out:
                    raise BlockFailed(f"its output does not contain {want!r}")
            except BaseException as exc:  # any failure of a block is reported, then the run ends
                traceback.print_exc(file=sys.stdout)
                print(f"DOC BLOCK FAILED: {b.where}: {type(exc).__name__}: {exc}", flush=True)
                return 1
            sys.stdout.flush()
        return 0
    finally:
        _stop(background)
        loop.close()


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    sys.exit(drive([Block(**s) for s in spec]))
