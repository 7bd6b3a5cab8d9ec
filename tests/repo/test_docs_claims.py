"""The docs' claims, checked against the code they describe (derived from the code where it
can be, so a renamed option or a new verb fails here instead of in a reader's hands):

- every name the README, API.md and the guides use from ``echomq`` (``from echomq import X``,
  ``echomq.X``, ``echomq.sub.Y``) exists: in ``echomq.__all__``, or a public submodule and its
  attribute;
- every keyword a snippet passes (in a code block or an inline code span) to ``App(...)``,
  ``@app.task(...)``, ``@app.periodic(...)``, ``task.options(...)``, ``signature.options``,
  ``task.enqueue_many(...)``, ``q.<verb>(...)`` and ``echomq.X(...)`` is in that callable's
  signature, and every ``q.<verb>`` exists on ``Queue``;
- every ``echomq COMMAND`` the docs show is a command of the CLI;
- sentences that were wrong once cannot come back: each is tied to the fact in the code that
  makes it wrong (``priority=`` exists, the default attempt budget, the missing chain verb).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docblocks import parse

import echomq
from echomq.cli import main as cli
from echomq.tasks.task import Signature

ROOT = Path(__file__).resolve().parents[2]
# contributing-docs.md describes these checks with placeholders (`echomq.X`, `echomq COMMAND`).
DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "API.md",
    *sorted(p for p in (ROOT / "docs" / "guides").glob("*.md") if p.name != "contributing-docs.md"),
]
PACKAGE = ROOT / "src" / "echomq"
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _prose(path: Path) -> str:
    """The text outside fenced blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def _snippets(path: Path) -> Iterator[tuple[str, str]]:
    """(where, Python source) for each python block and each inline code span that parses."""
    for b in parse(path, ROOT):
        if b.lang == "python":
            yield b.where, b.code
    foreign = path.name == "migrating.md"  # its tables' first column is another library's
    for n, line in enumerate(_prose(path).splitlines(), 1):
        ours = "|".join(line.split("|")[2:]) if foreign and line.startswith("|") else line
        for span in SPAN.findall(ours):
            yield f"{path.relative_to(ROOT)} (prose line ~{n})", span.lstrip("@")


def _tree(source: str) -> ast.AST | None:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    for text in (source, source + "\n    ..."):  # a decorator span: `@app.task(x=1)`
        try:
            tree: ast.AST = compile(text, "<doc>", "exec", flags=flags)
            return tree
        except SyntaxError:
            continue
    return None


def _all_snippets() -> list[tuple[str, ast.AST]]:
    out = []
    for path in DOCS:
        for where, source in _snippets(path):
            tree = _tree(source)
            if tree is not None:
                out.append((where, tree))
    return out


SNIPPETS = _all_snippets()


def _public_submodules() -> set[str]:
    return {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").exists())
    }


# --------------------------------------------------------------------------- names


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "echomq":
        return list(reversed(parts))
    return None


def _used_names() -> set[tuple[str, str]]:
    """(where, "echomq.X[.Y]") for every name a snippet takes from echomq."""
    used: set[tuple[str, str]] = set()
    for where, tree in SNIPPETS:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "echomq" or node.module.startswith("echomq."):
                    for alias in node.names:
                        used.add((where, f"{node.module}.{alias.name}"))
            elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                parts = _dotted(node)
                if parts:
                    used.add((where, ".".join(["echomq", *parts[:2]])))
    return used


# Dotted names in the docs that are not Python names: said why, once.
NOT_PYTHON = {
    "echomq.worker.jobs": "the logger of the worker's job lines",
    "echomq.attempt": "an attribute of the tracing span",
    "echomq.outcome": "an attribute of the tracing span",
    "echomq.task": "an attribute of the tracing span",
    "echomq.status": "an attribute of the tracing span",
}


def _missing(name: str) -> str | None:
    if name in NOT_PYTHON:
        return None
    parts = name.split(".")[1:]
    first = parts[0]
    if first in echomq.__all__ or first == "__all__":
        return None if len(parts) == 1 or hasattr(getattr(echomq, first), parts[1]) else name
    if first.startswith("_"):
        return f"{name} (private: docs use public names)"
    if first not in _public_submodules():
        return f"{name} (not in echomq.__all__, not a public submodule)"
    module = importlib.import_module(f"echomq.{first}")
    if len(parts) > 1 and not hasattr(module, parts[1]):
        try:  # a subpackage its package does not import (echomq.contrib.django)
            importlib.import_module(f"echomq.{first}.{parts[1]}")
        except ImportError:
            return name
    return None


def test_every_name_the_docs_take_from_echomq_exists() -> None:
    used = _used_names()
    assert len(used) > 50  # the walk sees the docs (a broken parser would see nothing)
    bad = sorted(f"{where}: {why}" for where, name in used if (why := _missing(name)))
    assert bad == []


# --------------------------------------------------------------------------- keywords


def _callable_for(call: ast.Call) -> tuple[str, Callable[..., Any]] | None:
    """The echomq callable a snippet's call reaches, when the docs' conventions name it:
    ``app`` is an App, ``q``/``queue``/``app.queue(..)`` a Queue, ``x.s(..).options`` a
    signature, any other ``.options``/``.enqueue_many`` a task."""
    f = call.func
    if isinstance(f, ast.Name) and f.id in echomq.__all__:
        return f.id, getattr(echomq, f.id)
    if not isinstance(f, ast.Attribute):
        return None
    parts = _dotted(f)
    if parts is not None:
        target: Any = echomq
        for p in parts:
            target = getattr(target, p, None)
            if target is None:
                return None  # an unknown name: the names test reports it
        return (".".join(parts), target) if callable(target) else None
    recv = f.value
    if isinstance(recv, ast.Name) and recv.id == "app" and f.attr in ("task", "periodic"):
        return f"App.{f.attr}", getattr(echomq.App, f.attr)
    if isinstance(recv, ast.Name) and recv.id in ("app", "tasks") and f.attr in ("queue", "flow"):
        return f"App.{f.attr}", getattr(echomq.App, f.attr)
    is_queue = (isinstance(recv, ast.Name) and recv.id in ("q", "queue")) or (
        isinstance(recv, ast.Call)
        and isinstance(recv.func, ast.Attribute)
        and recv.func.attr == "queue"
    )
    if is_queue:
        method = getattr(echomq.Queue, f.attr, None)
        return f"Queue.{f.attr}", method if method is not None else _no_such(f.attr)
    if f.attr == "options":
        sig = isinstance(recv, ast.Name) and recv.id in ("signature", "sig")
        if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
            sig = recv.func.attr == "s"
        if sig:
            return "Signature.options", Signature.options
        return "Task.options", echomq.Task.options
    if f.attr == "enqueue_many" and not (isinstance(recv, ast.Name) and recv.id == "q"):
        return "Task.enqueue_many", echomq.Task.enqueue_many
    return None


def _no_such(attr: str) -> Callable[..., Any]:
    def missing() -> None: ...

    missing.__qualname__ = f"<no Queue.{attr}>"
    return missing


def _keyword_problems() -> list[str]:
    found = []
    for where, tree in SNIPPETS:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            hit = _callable_for(node)
            if hit is None:
                continue
            name, fn = hit
            if fn.__qualname__.startswith("<no Queue."):
                found.append(f"{where}: {name} does not exist")
                continue
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in node.keywords:
                if kw.arg is not None and kw.arg not in params:
                    found.append(f"{where}: {name}() takes no keyword {kw.arg!r}")
    return found


def test_every_keyword_a_snippet_passes_is_in_the_signature() -> None:
    assert _keyword_problems() == []


def test_the_keyword_check_sees_the_options_it_guards() -> None:
    # The calls this check exists for are found (a rename of the conventions would make it
    # check nothing): @app.task(...), .options(...), q.<verb>(...), App(...).
    names = {
        hit[0]
        for _, tree in SNIPPETS
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (hit := _callable_for(node))
    }
    assert {"App.task", "Task.options", "Queue.enqueue", "App", "App.periodic"} <= names


# --------------------------------------------------------------------------- commands

COMMAND = re.compile(r"(?:^|[\s`$(])echomq ([a-z][a-z-]*)")


def test_every_echomq_command_the_docs_show_exists() -> None:
    commands = set(cli.commands)
    bad = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for span in SPAN.findall(line):
                for cmd in COMMAND.findall(" " + span):
                    if cmd not in commands:
                        bad.append(f"{path.relative_to(ROOT)}:{n}: echomq {cmd}")
    # Shell blocks too.
    for path in DOCS:
        for b in parse(path, ROOT):
            if b.lang in ("bash", "sh"):
                for cmd in COMMAND.findall("\n" + b.code):
                    if cmd not in commands:
                        bad.append(f"{b.where}: echomq {cmd}")
    assert sorted(set(bad)) == []


# --------------------------------------------------------------------------- claims


def _task_default(name: str) -> Any:
    return inspect.signature(echomq.App.task).parameters[name].default


def _claims() -> list[tuple[str, Callable[[str], str | None]]]:
    """(document, check(text) -> what is wrong, or None). Each check reads a fact from the
    code, not from this file."""
    has_priority = "priority" in inspect.signature(echomq.App.task).parameters
    has_chain = hasattr(echomq.App, "chain")
    attempts = _task_default("max_attempts")
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}

    def no_priority_denial(text: str) -> str | None:
        hit = re.search(r"\bno priorit(y|ies)\b", text, re.IGNORECASE)
        if has_priority and hit:
            return f"says {hit.group(0)!r}, but @app.task(priority=) exists"
        return None

    def attempts_default(text: str) -> str | None:
        pattern = r"\b(\w+) attempts by default|max_attempts`[^.(]*\((\w+) by default"
        for m in re.finditer(pattern, text):
            said = m.group(1) or m.group(2)
            if said not in (str(attempts), words.get(attempts)):
                return f"says {m.group(0)!r}, but max_attempts defaults to {attempts}"
        return None

    def readme_states_the_default(text: str) -> str | None:
        if not re.search(rf"max_attempts` claims \({attempts} by default", text):
            return f"the retry paragraph must state the default ({attempts} attempts)"
        return None

    def celery_row(name: str, key: str, needle: str, why: str) -> Callable[[str], str | None]:
        """The first table row whose Celery column holds `key` must say `needle`."""

        def row(text: str) -> str | None:
            rows = [ln for ln in text.splitlines() if ln.startswith("|") and key in ln]
            return None if rows and needle in rows[0].split("|", 2)[2] else why

        row.__name__ = f"celery_{name}"
        return row

    def celery_chain(text: str) -> str | None:
        rows = [ln for ln in text.splitlines() if ln.startswith("| `chain(")]
        if not rows:
            return "no row for Celery's chain"
        right = rows[0].split("|")[2]
        if has_chain:
            return None if "app.chain" in right else "App.chain exists: the row must name it"
        if "app.flow" in right:
            return "a flow's children run in parallel: chain is not a flow (that is a chord)"
        if "planned" not in right:
            return "there is no chain verb: the row must say how, today, and that it is planned"
        return None

    def celery_retries(text: str) -> str | None:
        if not re.search(rf"any exception retries.*{attempts} attempts", text):
            return f"must say that any exception retries, {attempts} attempts by default"
        return None

    last_decision = max(
        int(n) for n in re.findall(r"\bD(\d+)\b", (ROOT / "docs" / "PROTOCOL.md").read_text())
    )

    def decision_range(text: str) -> str | None:
        for m in re.finditer(r"\bD1`?[\u2013-]`?D(\d+)\b", text):
            if int(m.group(1)) != last_decision:
                return f"says {m.group(0)!r}, but PROTOCOL.md defines D1-D{last_decision}"
        return None

    every = [str(p.relative_to(ROOT)) for p in DOCS]
    out: list[tuple[str, Callable[[str], str | None]]] = []
    out += [(d, no_priority_denial) for d in every]
    out += [(d, attempts_default) for d in every]
    out += [("README.md", readme_states_the_default)]
    out += [(d, decision_range) for d in every]
    migrating = "docs/guides/migrating.md"
    out += [
        (migrating, celery_chain),
        (migrating, celery_retries),
        (
            migrating,
            celery_row("task_id", "task_id", "dedup=", "task_id (a business key) maps to dedup="),
        ),
        (
            migrating,
            celery_row("bind", "bind=True", "current_job()", "bind=True maps to current_job()"),
        ),
        (
            migrating,
            celery_row("chord", "chord(", "app.flow", "a chord is a flow: children, then parent"),
        ),
    ]
    return out


@pytest.mark.parametrize(
    ("doc", "check"), _claims(), ids=lambda v: v if isinstance(v, str) else v.__name__
)
def test_claim(doc: str, check: Callable[[str], str | None]) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert check(text) is None, f"{doc}: {check(text)}"
