"""The scripts in examples/ run as written against a server and print what they document.

Each runs as a subprocess from an empty directory (as from a clean clone: no ``echomq
server`` of the working directory to find), with ``ECHOMQ_URL`` pointing at the test server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, url: str, tmp_path: Path, timeout: float = 60) -> str:
    env = dict(os.environ)
    env["ECHOMQ_URL"] = url
    # The package under test, whatever the editable install points at.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        check=False,  # the return code is asserted with the output in the message
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_is_tested() -> None:
    # A new example without a test here would go unchecked.
    tested = {"flow.py", "periodic.py", "controls.py", "quickstart.py", "chain.py", "batch.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_flow_example(url: str, tmp_path: Path) -> None:
    out = run_example("flow.py", url, tmp_path)
    lines = out.splitlines()
    assert re.fullmatch(r"parent \S+ waits for 3 children", lines[0]), out
    # The parent ran once, after its children, with all three results: 3 + 2 + 1 words.
    assert lines[1:] == ["corpus: 6 words in 3 documents"], out


def test_chain_example(url: str, tmp_path: Path) -> None:
    out = run_example("chain.py", url, tmp_path)
    assert out.splitlines() == [
        "chain: invoice for 450.00",  # 300, then * 1.5, then the invoice (across two queues)
        "group: [100, 200, 300]",  # the values in the group's order
        "chord: 900",  # the callback got [400, 500]
        "failed at step 1: ValueError: no stock for 100",  # the step that died, by index
    ], out


def test_batch_example(url: str, tmp_path: Path) -> None:
    out = run_example("batch.py", url, tmp_path)
    lines = out.splitlines()
    assert re.fullmatch(r"batch \S+ closed with 6 members so far", lines[0]), out
    # 5 + 1 members, then 2 added by a member: 7 completed, 1 died; each callback once.
    assert sorted(lines[1:3]) == ["on_complete: 7 resized, 1 dead", "on_death fired"], out
    assert lines[3:] == ["fired: ['complete', 'death']"], out


def test_periodic_example(url: str, tmp_path: Path) -> None:
    out = run_example("periodic.py", url, tmp_path)
    beats = [ln for ln in out.splitlines() if ln.startswith("heartbeat due at ")]
    # Every 1000 ms for ~3.5 s: the first fires at registration, so 3 or 4 (generous margin
    # for a loaded machine: at least 2, never more than 4). Each line is the occurrence's due
    # time, 1000 ms apart on the entry's grid: never the same second twice (exactly once each).
    # (It printed the run's wall clock once, and a loaded CI ran two occurrences in one second.)
    assert 2 <= len(beats) <= 4, out
    assert len(set(beats)) == len(beats), out
    assert "cleaning up" not in out  # nightly, 03:00 Berlin: not within the run
    registered = sorted(ln for ln in out.splitlines() if ln.startswith("registered: "))
    assert len(registered) == 2, out
    assert any(ln.endswith("every 1000 ms") and "heartbeat" in ln for ln in registered), out
    assert any(
        ln.endswith("cron '0 3 * * *' Europe/Berlin") and "nightly_cleanup" in ln
        for ln in registered
    ), out


def test_controls_example(url: str, tmp_path: Path) -> None:
    out = run_example("controls.py", url, tmp_path)
    lines = out.splitlines()
    expect = [
        r"add\(2, 3\) = 5",
        r"  waited \d+\.\d ms",
        r"fails\(\) died: ValueError: no such account",
        r"dedup: enqueued then deduplicated \(same id: True \)",
        r"tenant-7 after 0\.3 s: 2 of 4 still waiting",
        r"call_provider\(\) = sent after 3 runs",
        r"cancel a scheduled job: removed",
        r"cancel a running job: signalled",
        r"  it ended dead with: cancelled",
    ]
    assert len(lines) == len(expect), out
    for pattern, line in zip(expect, lines, strict=True):
        assert re.fullmatch(pattern, line), (pattern, out)


def test_quickstart_example(url: str, tmp_path: Path) -> None:
    out = run_example("quickstart.py", url, tmp_path)
    assert out.splitlines() == [
        "enqueued: enqueued",
        "result: welcome mail sent to ada@example.com",
        "left: {'pending': 0, 'active': 0, 'schedule': 0, 'dead': 0}",
    ], out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
