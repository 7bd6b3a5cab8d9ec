"""The README's test command (issue 27 #9): what `scripts/check` installs is said, and
`scripts/check --fast` is the inner loop — the same lint and types, the tests not marked
slow — while CI (`.ci/run`) keeps running plain `scripts/check`, everything."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_says_what_scripts_check_installs_and_how_to_run_it_fast() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split("## Why echomq", 1)[0].split())
    for said in (
        "`chromium` and `chromium-driver`",
        "`build-essential` and `valgrind`",
        "`en_US.UTF-8` locale",
        "`lua5.1`",
        "`scripts/check --fast`",
        "not marked `slow`",
    ):
        assert said in readme, said
    script = (ROOT / "scripts" / "check").read_text()
    for package in (
        "chromium chromium-driver",
        "build-essential valgrind",
        "locales",
        "install -y -qq lua5.1",
    ):
        assert package in script, package  # the README names what the script really installs


def test_fast_runs_lint_types_and_the_tests_not_marked_slow() -> None:
    script = (ROOT / "scripts" / "check").read_text()
    assert re.search(r'if \[ "\$\{1:-\}" = "--fast" \]; then\s+FAST=1\s+shift', script)
    assert '-m pytest "${WORKERS[@]}" -m "not slow" "$@"' in script
    # ruff and mypy run either way: they come before the one branch on FAST that picks tests.
    lint = script.index("-m ruff check src tests bench examples")
    types = script.index("-m mypy --strict src")
    assert lint < types < script.index('if [ "$FAST" = 1 ]; then\n  echo "check: pytest')
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "exec scripts/check"  # CI: the whole suite, no --fast


def test_no_test_that_needs_chromium_or_valgrind_runs_under_fast() -> None:
    """--fast skips installing them, so each test that needs them must be marked slow."""
    needs = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"valgrind_server\(|webdriver", p.read_text())
    )
    assert "tests/ops/test_browser.py" in needs and len(needs) >= 5, needs
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", *needs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    nodes = [x for x in done.stdout.splitlines() if "::" in x]
    assert nodes  # the other tests of those files still run
    assert not [x for x in nodes if x.startswith("tests/ops/test_browser.py")], nodes
    assert not [x for x in nodes if x.split("::")[1].startswith("test_valgrind")], nodes


def test_every_test_listed_slow_in_conftest_exists() -> None:
    """conftest.SLOW_TESTS names tests by id: a renamed test must not drop out silently."""
    from conftest import SLOW_TESTS

    files = sorted({name.split("::")[0] for name in SLOW_TESTS})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    marked = {x.split("[", 1)[0] for x in done.stdout.splitlines() if "::" in x}
    assert sorted(SLOW_TESTS - marked) == []


def test_the_generated_native_files_are_checked_before_the_build() -> None:
    """Issue 23: the C command table and key constants come from the Lua headers; a header
    changed without `scripts/gen-native` fails the check before the module is built."""
    script = (ROOT / "scripts" / "check").read_text()
    gen = script.index('"$ECHOMQ_PYTHON" scripts/gen-native --check')
    assert script.index("source scripts/ensure-venv") < gen < script.index("make -s -C native")
