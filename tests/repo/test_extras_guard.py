"""Every optional extra is optional in fact (issue 36): with the extras' modules made
unimportable, every module a base install uses imports, ``echomq --help`` and each command's
``--help`` run, and a feature of a missing extra says, when it is used, which extra to
install (``MissingExtra`` in the API, one ``error:`` line and exit 2 in the CLI).

The suite runs with the dev extras installed, so it could not see a base install's
``ModuleNotFoundError``; each test here runs a fresh interpreter whose ``sys.meta_path``
refuses the extras' top-level modules, as a base install would. (The wheel installed with no
extras into a venv of its own is ``test_user_install.py``: slower, and marked slow.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from echomq.protocol import extras as _extras

SRC = Path(__file__).resolve().parents[2] / "src"

# The extras' own features: each imports its extra at import time on purpose (importing it
# is using it), and raises MissingExtra naming that extra without it (checked below).
FEATURES = {
    "echomq.web": "web",  # the dashboard (starlette, jinja2; and its submodules)
    "echomq.prometheus": "web",  # Prometheus metrics (prometheus_client)
    "echomq.otel": "otel",  # tracing (opentelemetry)
    "echomq.contrib.django": "django",  # the Django task backend (django, django_tasks)
}

# Installed first in each child: the extras' modules are not there, whatever the venv holds.
BLOCKER = """
import json, sys

ARGS = json.loads(sys.argv[1])
BLOCKED = frozenset(ARGS["blocked"])
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "imported before the blocker"


class _NoExtras:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: an extra)", name=name)
        return None


sys.meta_path.insert(0, _NoExtras())
"""
BLOCKED = sorted({m for mods in _extras.EXTRAS.values() for m in mods})


def run_blocked(body: str) -> subprocess.CompletedProcess[str]:
    """``body`` in a fresh interpreter without the extras; its last stdout line is JSON."""
    code = BLOCKER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps({"blocked": BLOCKED, "features": FEATURES})],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=SRC.parent,
        check=False,
    )


def result(proc: subprocess.CompletedProcess[str]) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_base_module_imports_without_the_extras() -> None:
    proc = run_blocked(
        """
        import importlib, json, pkgutil
        import echomq

        FEATURES = ARGS["features"]
        imported, refused = [], {}
        for info in pkgutil.walk_packages(echomq.__path__, "echomq."):
            name = info.name
            if name == "echomq.__main__":  # runs the CLI: its import is echomq.cli's
                continue
            feature = next((f for f in FEATURES if name == f or name.startswith(f + ".")), None)
            if feature is None:
                importlib.import_module(name)
                imported.append(name)
                continue
            try:
                importlib.import_module(name)
            except echomq.MissingExtra as exc:
                refused[name] = [exc.extra, str(exc)]
        print(json.dumps({"imported": imported, "refused": refused}))
        """
    )
    got = result(proc)
    assert isinstance(got, dict)
    # The walk found the package (a broken walk would pass vacuously).
    for name in ("echomq.cli", "echomq.cli.serve", "echomq.worker", "echomq.demo", "echomq.top"):
        assert name in got["imported"]
    # Every feature module (and each web submodule) refused with its own extra, in one line.
    assert set(FEATURES) <= set(got["refused"])
    for name, (extra, message) in got["refused"].items():
        top = next(f for f in FEATURES if name == f or name.startswith(f + "."))
        assert extra == FEATURES[top], (name, extra)
        assert f"pip install 'echomq[{extra}]'" in message and "\n" not in message


def test_cli_help_of_every_command_without_the_extras() -> None:
    proc = run_blocked(
        """
        import json
        import click
        from click.testing import CliRunner
        from echomq.cli import main

        def paths(group, prefix):
            for name, cmd in sorted(group.commands.items()):
                yield [*prefix, name]
                if isinstance(cmd, click.Group):
                    yield from paths(cmd, [*prefix, name])

        runner = CliRunner()
        out = {}
        for path in [[], *paths(main, [])]:
            r = runner.invoke(main, [*path, "--help"], prog_name="echomq")
            out[" ".join(path)] = [r.exit_code, r.output[:60], repr(r.exception)]
        print(json.dumps(out))
        """
    )
    got = result(proc)
    assert isinstance(got, dict)
    for name in ("", "worker", "server", "demo", "dashboard", "metrics", "enqueue", "stats"):
        assert name in got, sorted(got)
    for name, (code, output, exc) in got.items():
        assert code == 0, (name, output, exc)
        assert output.startswith("Usage: echomq"), (name, output)


def test_a_missing_extra_is_one_line_when_its_feature_is_used() -> None:
    """In the API a typed error naming the extra; in the CLI one ``error:`` line, exit 2,
    before anything starts (no server is needed to refuse)."""
    proc = run_blocked(
        """
        import json
        from click.testing import CliRunner
        import echomq
        from echomq.ops import console as _console
        from echomq.cli import main
        from echomq.serializers import MsgPack, resolve_serializer

        out = {}
        for what, make in [
            ("MsgPack()", MsgPack),
            ("resolve", lambda: resolve_serializer("msgpack")),
            ("App", lambda: echomq.App(url="redis://127.0.0.1:1/0", serializer="msgpack")),
        ]:
            try:
                make()
                out[what] = None
            except echomq.MissingExtra as exc:
                out[what] = [exc.extra, exc.module, str(exc), isinstance(exc, ImportError)]
        # The console shows a msgpack payload it cannot decode as its bytes.
        out["preview"] = list(_console.preview(None, b"\\x93\\xa1t\\x90\\x80"))
        runner = CliRunner()
        for cmd in (
            ["dashboard", "--port", "1"],
            ["metrics", "--port", "1"],
            ["worker", "nomodule:app", "--metrics-port", "1"],
        ):
            r = runner.invoke(main, cmd, prog_name="echomq")
            out[cmd[0]] = [r.exit_code, r.output, repr(r.exception)]
        # A worker of an app whose serializer is msgpack: refused as it loads the app.
        import os, tempfile
        os.chdir(tempfile.mkdtemp())
        with open("emq_msgpack_app.py", "w") as f:
            f.write("import echomq\\napp = echomq.App(serializer='msgpack')\\n")
        r = runner.invoke(main, ["worker", "emq_msgpack_app:app"], prog_name="echomq")
        out["worker-app"] = [r.exit_code, r.output, repr(r.exception)]
        print(json.dumps(out))
        """
    )
    got = result(proc)
    assert isinstance(got, dict)
    for what in ("MsgPack()", "resolve", "App"):
        extra, module, message, is_import_error = got[what]
        assert (extra, module, is_import_error) == ("msgpack", "msgpack", True)
        assert "pip install 'echomq[msgpack]'" in message, message
    assert got["preview"] == [None, repr(b"\x93\xa1t\x90\x80")]
    for cmd, extra in (
        ("dashboard", "web"),
        ("metrics", "web"),
        ("worker", "web"),
        ("worker-app", "msgpack"),
    ):
        code, output, _exc = got[cmd]
        assert code == 2, (cmd, output)
        lines = output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (cmd, output)
        assert f"pip install 'echomq[{extra}]'" in lines[0], (cmd, output)
        assert "Traceback" not in output


def _module(requirement: str) -> str:
    name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
    return {"opentelemetry-api": "opentelemetry"}.get(name, name.replace("-", "_"))


def test_the_extras_are_pyprojects() -> None:
    """``protocol.extras.EXTRAS`` (what the blocker refuses and ``require`` imports) is each
    extra of pyproject.toml with a module per requirement; the web extra's ``rich`` is a base
    dependency as well, so a base install has it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    base = {_module(r) for r in project["dependencies"]}
    declared = {
        extra: tuple(m for m in map(_module, reqs) if m not in base)
        for extra, reqs in project["optional-dependencies"].items()
        if extra != "dev"
    }
    assert declared == _extras.EXTRAS


def test_missing_extra_pickles() -> None:
    """A handler's MissingExtra crosses from a process-pool child to its worker pickled."""
    import pickle

    from echomq import MissingExtra

    sent = MissingExtra("web", "the dashboard", "starlette")
    got = pickle.loads(pickle.dumps(sent))
    assert isinstance(got, MissingExtra) and isinstance(got, ImportError)
    assert (got.extra, got.feature, got.module, str(got)) == (
        sent.extra,
        sent.feature,
        sent.module,
        str(sent),
    )
