"""The user's install (issue 36): the wheel, installed with no extras into a fresh venv outside
the source tree, runs the README's quick start, the demo and the deployment guide's worker
command; each extra, installed, makes its feature work.

Every other test runs in the project venv with the dev extras (msgpack, otel, web all there)
and the source tree importable, so none of them would see a base install that cannot start.
Here the wheel is built from this checkout (``pip wheel --no-deps``, as the README says),
each venv is made ``--without-pip`` and filled by the project venv's pip (``pip --python``,
quicker than bootstrapping pip into each), and every command runs with its cwd in a temp
directory and a clean environment: no ``src/`` on the path, no ``ECHOMQ_*`` setting, no
``ECHOMQ_HOME`` (so ``echomq server`` records itself in ``./.echomq/`` as a user's does).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import wait_for
from echomq.protocol import extras as _extras
from echomq.server import EmbeddedServer, free_port

# A wheel build and four pip installs: the first test to need a venv waits for its install
# (about two minutes on a busy two-core machine), over the suite's 300 s per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEPLOYMENT = (ROOT / "docs" / "guides" / "deployment.md").read_text()


class Venv:
    """A venv holding the wheel (with ``extras``) and nothing of the source tree."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user's shell with this venv active: the suite's own
        settings (ECHOMQ_*, the test HOME's ECHOMQ_HOME, PYTHONPATH) removed."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ECHOMQ_", "PYTHON", "VIRTUAL_ENV", "PYTEST"))
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.path)
        env["COLUMNS"] = "160"
        env.update(extra)
        return env

    def run(
        self, args: list[str], cwd: Path, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=cwd,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def python(
        self, code: str, cwd: Path, timeout: float = 120, argv: list[str] | None = None, **env: str
    ) -> object:
        """Run ``code`` with the venv's python; its last stdout line, as JSON."""
        args = [str(self.bin / "python"), "-c", textwrap.dedent(code), *(argv or [])]
        done = self.run(args, cwd, timeout, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def start(self, args: list[str], cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                args, cwd=cwd, env=self.env(**env), stdout=out, stderr=subprocess.STDOUT
            )


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM, as a service manager stops it; the exit code (SIGKILL if it hangs)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("echomq-*.whl")
    return found


# The venvs of the module: the extra ("": a base install) and what else goes in (the
# OpenTelemetry SDK, for its in-memory exporter).
VENVS: dict[str, tuple[str, ...]] = {
    "": (),
    "msgpack": (),
    "web": (),
    "otel": ("opentelemetry-sdk",),
}


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Venv]]:
    """``venv("web")``: the venv with the wheel and that extra (``""``: none). All four are
    installed at once, in the background, when the module starts (pip is most of this
    module's time); a test waits for its own."""
    installs: dict[str, tuple[Venv, subprocess.Popen[bytes], Path]] = {}
    for extra, also in VENVS.items():
        root = tmp_path_factory.mktemp(f"venv-{extra or 'base'}")
        path = root / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300
        )
        spec = f"{wheel}[{extra}]" if extra else str(wheel)
        pip = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python")]
        log = root / "pip.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*pip, "install", "-q", "--no-compile", spec, *also],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        installs[extra] = (Venv(path), proc, log)

    def get(extra: str) -> Venv:
        made, proc, log = installs[extra]
        assert proc.wait(900) == 0, log.read_text()
        return made

    yield get
    for _made, proc, _log in installs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A user's project directory, outside the source tree."""
    assert ROOT not in tmp_path.parents
    return tmp_path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A server of the module's own for the extras' tests (the base tests start theirs
    the user's way, with ``echomq server``)."""
    with EmbeddedServer(tmp_path_factory.mktemp("srv"), appendonly=False) as srv:
        yield srv


def readme_quickstart() -> tuple[str, list[list[str]]]:
    """The README's ``tasks.py`` and its three commands (server, worker, producer)."""
    tasks = re.search(
        r"A task module, `tasks.py`:\n\n(?:<!--.*?-->\n)?```python\n(.*?)```", README, re.S
    )
    assert tasks, "the README's quick start lost its tasks.py block"
    block = re.search(r"In three terminals.*?```bash\n(.*?)```", README, re.S)
    assert block, "the README's quick start lost its three commands"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    assert [c[:2] for c in commands] == [
        ["echomq", "server"],
        ["echomq", "worker"],
        ["python3", "-c"],
    ]
    return tasks.group(1), commands


# --------------------------------------------------------------------------- no extras


def test_the_base_install_has_no_extra_and_not_the_source_tree(
    venv: Callable[[str], Venv], here: Path
) -> None:
    base = venv("")
    mods = sorted({m for ms in _extras.EXTRAS.values() for m in ms})
    got = base.python(
        """
        import importlib.util, json, sys
        import echomq
        found = [m for m in sys.argv[1].split(",") if importlib.util.find_spec(m)]
        print(json.dumps({"file": echomq.__file__, "found": found}))
        """,
        here,
        argv=[",".join(mods)],
    )
    assert isinstance(got, dict)
    assert got["found"] == []  # a test that passed with an extra present would prove nothing
    assert Path(got["file"]).is_relative_to(base.path), got["file"]


def test_help_and_every_commands_help(venv: Callable[[str], Venv], here: Path) -> None:
    """``echomq --help`` by the installed entry point; each command's ``--help`` in one more
    process (click's runner), not one process each: it is the imports that are tested."""
    base = venv("")
    done = base.run(["echomq", "--help"], here)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: echomq")
    commands = re.findall(r"^  ([a-z][a-z-]*)\s", done.stdout.split("Commands:")[1], re.M)
    assert {"worker", "server", "demo", "dashboard", "stats"} <= set(commands)
    got = base.python(
        """
        import json, sys
        from click.testing import CliRunner
        from echomq.cli import main

        out = {}
        for name in sys.argv[1:]:
            r = CliRunner().invoke(main, [name, "--help"], prog_name="echomq")
            out[name] = [r.exit_code, r.output[:40], repr(r.exception)]
        print(json.dumps(out))
        """,
        here,
        argv=commands,
    )
    assert isinstance(got, dict) and sorted(got) == sorted(commands)
    for name, (code, output, exc) in got.items():
        assert code == 0 and output.startswith("Usage: echomq"), (name, output, exc)


def test_the_readme_quick_start(venv: Callable[[str], Venv], here: Path) -> None:
    """``echomq server``, ``echomq worker tasks:app -c 20`` and the producer line, as the
    README has them, from the directory of its ``tasks.py``."""
    base = venv("")
    tasks, (server_cmd, worker_cmd, producer_cmd) = readme_quickstart()
    (here / "tasks.py").write_text(tasks)
    srv = base.start(server_cmd, here, here / "server.log")
    worker = None
    try:
        record = here / ".echomq" / "server.json"
        wait_for(lambda: record.exists() or srv.poll() is not None, 120, 0.1)
        assert srv.poll() is None, (here / "server.log").read_text()
        worker = base.start(worker_cmd, here, here / "worker.log")
        # The worker is up once it is in the registry: the producer's wait is only 10 s.
        wait_for(lambda: worker_listed(base, here) or worker.poll() is not None, 120, 0.5)
        assert worker.poll() is None, (here / "worker.log").read_text()
        done = base.run(["python", *producer_cmd[1:]], here)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "welcome mail sent to ada@example.com"
        stats = base.run(["echomq", "stats"], here)
        assert stats.returncode == 0 and "emails" in stats.stdout, stats.stderr
    finally:
        if worker is not None:
            assert stop(worker) == 0, (here / "worker.log").read_text()
        assert stop(srv) == 0, (here / "server.log").read_text()
    assert "Traceback" not in (here / "worker.log").read_text()


def worker_listed(base: Venv, here: Path) -> bool:
    done = base.run(["echomq", "workers"], here)
    return done.returncode == 0 and "emails" in done.stdout


def test_the_deployment_images_worker_command(
    venv: Callable[[str], Venv], here: Path, server: EmbeddedServer
) -> None:
    """deploy/Dockerfile's worker CMD (``echomq worker myproject.tasks:app -c 50 --grace 30
    --health-port 8080``; the guide shows the file verbatim, tests/repo/test_deploy.py) on a
    plain install with ``ECHOMQ_URL`` set, as its compose file runs it: /readyz answers 200,
    it serves a job, /livez answers 200, and SIGTERM (its STOPSIGNAL) stops it with exit 0.
    Only the health port differs: 8080 may be taken on a shared machine."""
    base = venv("")
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert dockerfile in DEPLOYMENT
    cmd = re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd, "deploy/Dockerfile lost its CMD"
    args = json.loads(cmd[-1])  # the last stage's: the worker, the default target
    assert args[:3] == ["echomq", "worker", "myproject.tasks:app"]
    assert re.search(r"^RUN pip install --no-cache-dir \. ", dockerfile, re.M)  # no extras
    port = free_port()
    args[args.index("--health-port") + 1] = str(port)
    (here / "myproject").mkdir()
    (here / "myproject" / "__init__.py").write_text("")
    (here / "myproject" / "tasks.py").write_text(
        textwrap.dedent(
            """
            import echomq

            app = echomq.App()

            @app.task(queue="deploy", keep_result_ms=60_000)
            def double(n: int) -> int:
                return 2 * n
            """
        )
    )
    worker = base.start(args, here, here / "worker.log", ECHOMQ_URL=server.url)
    try:
        ready = f"http://127.0.0.1:{port}/readyz"
        wait_for(lambda: (fetch(ready) or (0,))[0] == 200 or worker.poll() is not None, 120, 0.2)
        assert fetch(ready) == (200, '{"status": "ready"}'), (here / "worker.log").read_text()
        got = base.python(
            """
            import json
            from myproject.tasks import double
            print(json.dumps(double.enqueue(21).wait(timeout_s=120)))
            """,
            here,
            timeout=180,
            ECHOMQ_URL=server.url,
        )
        assert got == 42
        live = fetch(f"http://127.0.0.1:{port}/livez")
        assert live is not None and live[0] == 200, live
    finally:
        assert stop(worker) == 0, (here / "worker.log").read_text()


def test_the_demo(venv: Callable[[str], Venv], here: Path) -> None:
    """``echomq demo`` on its own embedded server, a small run (a worker still SIGKILLed)."""
    done = venv("").run(["echomq", "demo", "--jobs", "600", "--workers", "2"], here, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo ok" in done.stdout


def test_a_missing_extra_is_one_line(
    venv: Callable[[str], Venv], here: Path, server: EmbeddedServer
) -> None:
    base = venv("")
    for args in (
        ["echomq", "--url", server.url, "dashboard", "--port", str(free_port())],
        ["echomq", "--url", server.url, "metrics", "--port", str(free_port())],
    ):
        done = base.run(args, here)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("error: ") and "pip install 'echomq[web]'" in done.stderr
    got = base.python(
        """
        import json
        import echomq
        out = {}
        for what, use in [
            ("msgpack", lambda: echomq.App(serializer="msgpack")),
            ("otel", lambda: __import__("echomq.otel")),
            ("web", lambda: __import__("echomq.web")),
        ]:
            try:
                use()
            except echomq.MissingExtra as exc:
                out[what] = [exc.extra, str(exc)]
        print(json.dumps(out))
        """,
        here,
    )
    assert isinstance(got, dict)
    for extra in ("msgpack", "otel", "web"):
        assert got[extra][0] == extra
        assert f"pip install 'echomq[{extra}]'" in got[extra][1]


# --------------------------------------------------------------------------- each extra

# A job through the server and an in-process worker that stops after it (max_jobs=1).
ROUND_TRIP = """
import json, sys
import echomq

app = echomq.App(url=sys.argv[1], serializer=sys.argv[2])

@app.task(queue="extra-" + sys.argv[2], keep_result_ms=60_000)
def echo(blob: bytes, n: int) -> list:
    return [blob.hex(), n]

{before_worker}
sent = echo.enqueue(b"\\x00\\xff", 7)
echomq.Worker(app, max_jobs=1).run()
print(json.dumps({{"result": sent.wait(timeout_s=60), "out": {after}}}))
"""


def test_the_msgpack_extra(venv: Callable[[str], Venv], here: Path, server: EmbeddedServer) -> None:
    v = venv("msgpack")
    code = ROUND_TRIP.format(before_worker="", after="None")
    done = v.run([str(v.bin / "python"), "-c", code, server.url, "msgpack"], here)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["result"] == ["00ff", 7]


def test_the_web_extra(venv: Callable[[str], Venv], here: Path, server: EmbeddedServer) -> None:
    v = venv("web")
    port = free_port()
    dash = v.start(
        ["echomq", "--url", server.url, "dashboard", "--host", "127.0.0.1", "--port", str(port)],
        here,
        here / "dashboard.log",
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: fetch(base + "/healthz") or dash.poll() is not None, 120, 0.2)
        assert dash.poll() is None, (here / "dashboard.log").read_text()
        assert fetch(base + "/healthz") == (200, "ok")
        status, body = fetch(base + "/metrics") or (0, "")
        assert status == 200 and "echomq_" in body, body[:500]
    finally:
        stop(dash)


def fetch(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode().strip()
    except urllib.error.HTTPError as exc:  # a 503 is an answer too
        return exc.code, exc.read().decode().strip()
    except OSError:
        return None


def test_the_otel_extra(venv: Callable[[str], Venv], here: Path, server: EmbeddedServer) -> None:
    v = venv("otel")
    before = textwrap.dedent(
        """
        import echomq.otel
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        echomq.otel.instrument(app, tracer_provider=provider)
        """
    )
    after = "sorted(s.name for s in exporter.get_finished_spans())"
    code = ROUND_TRIP.format(before_worker=before, after=after)
    done = v.run([str(v.bin / "python"), "-c", code, server.url, "json"], here)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["result"] == ["00ff", 7]
    # One producer span and one consumer span, named after the queue (messaging semconv).
    (process, send) = got["out"]
    assert process.startswith("process ") and send == process.replace("process", "send", 1)
