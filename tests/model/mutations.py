"""Mutation check of the model test (issue 22, point 4): re-introduce each seam bug on a
scratch copy and show that tests/test_model.py fails within its CI budget.

One command, from the repository root, after the fixes landed::

    .venv/bin/python tests/model/mutations.py                 # every seam, auto-detected
    .venv/bin/python tests/model/mutations.py --fix 1=abc123 --fix 5=def456,0a1b2c
    .venv/bin/python tests/model/mutations.py --only 1,reap-dedup --no-shrink

How a bug is re-introduced: each seam's *fix commit(s)* are reverted on a scratch worktree
(``git worktree add --detach`` of ``--base``, default HEAD) for the product's code only
(``src/`` and ``native/``): the tests stay as they are on the base, so the model test and the
regression tests are the fixed ones. A seam's commits come from ``--fix NAME=SHA[,SHA...]``,
else from the commits whose message carries the tag ``seam:NAME`` (e.g. a line
``seam:remove-flows`` in the body). A seam with neither is reported as "no fix commit".

Then, per seam, in the scratch tree (PYTHONPATH=<scratch>/src, so both ``echomq`` and the
native module built from ``<scratch>/native`` are the mutant):

1. the whole model file at its CI budget (machine legs and fixed scenarios);
2. the random machine alone (``-k machine``: every leg, no fixed scenario), so the report
   shows whether hypothesis finds the bug by itself within the CI budget, with the sequence
   it printed (``--no-shrink``: the first, unshrunk, failing sequence; faster).

The report is a table: seam, reverted commits, model file failed (yes/no, which tests), the
machine's verdict and its printed sequence. Exit status 1 when any mutant survives (the model
passed with the bug back in), 2 on a usage or git error.

Seams (the names ``--fix`` and ``seam:`` use):

- ``1``: a flow child counted twice (ignored death, reprocess, completion);
- ``4``: the cancel flag outlives its run;
- ``5``: a re-admitted or reprocessed id reads its previous incarnation's result;
- ``remove-flows``: a child settling toward a removed (or drained/cancelled) parent writes
  orphan flow keys (FINDINGS.md F1, F10);
- ``reap-dedup``: a debounce hands its payload to a reaped holder whose old lease is still
  open (FINDINGS.md F9).

Run it on a quiet machine: each seam costs one CI-budget run of the model file (~1 minute)
plus the machine run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SEAMS: dict[str, str] = {
    "1": "a flow child counted twice (ignored death, reprocess, completion)",
    "4": "the cancel flag outlives its run",
    "5": "a re-admitted/reprocessed id reads its previous result",
    "remove-flows": "a child's settle writes orphan keys of a removed parent",
    "reap-dedup": "a debounce hands its payload to a reaped, still-leased holder",
}

SEQUENCE = re.compile(r"^(?:E\s+)?(state = ModelMachine\(\)|state\.\w+\(.*\))\s*$")


@dataclass
class Outcome:
    seam: str
    commits: list[str]
    note: str = ""
    file_failed: bool | None = None
    failed_tests: list[str] = field(default_factory=list)
    machine_failed: bool | None = None
    sequence: list[str] = field(default_factory=list)
    seconds: float = 0.0


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def tagged(repo: Path, base: str, seam: str) -> list[str]:
    out = git(repo, "log", "--format=%H", f"--grep=seam:{seam}\\b", "-E", base)
    return out.split()[::-1]  # oldest first


def pytest(scratch: Path, python: str, k: str | None, shrink: bool) -> tuple[int, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(scratch / "src") + os.pathsep + str(scratch / "tests")
    env.pop("ECHOMQ_MODEL_WAIVE", None)
    env.pop("ECHOMQ_MODEL_DEEP", None)
    if not shrink:
        env["ECHOMQ_MODEL_NOSHRINK"] = "1"
    cmd = [
        python,
        "-m",
        "pytest",
        "tests/test_model.py",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
    ]
    if k:
        cmd += ["-k", k]
    done = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def run_seam(
    repo: Path, base: str, seam: str, commits: list[str], python: str, shrink: bool
) -> Outcome:
    out = Outcome(seam, commits)
    if not commits:
        out.note = f"no fix commit (pass --fix or tag the fix 'seam:{seam}')"
        return out
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"emq-mut-{seam}-") as tmp:
        scratch = Path(tmp) / "tree"
        git(repo, "worktree", "add", "--detach", str(scratch), base)
        try:
            for sha in reversed(commits):  # newest first, as a revert stack
                diff = git(repo, "diff", f"{sha}^", sha, "--", "src", "native")
                if not diff.strip():
                    continue
                apply = subprocess.run(
                    ["git", "-C", str(scratch), "apply", "-R", "--3way", "-"],
                    input=diff,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if apply.returncode:
                    out.note = f"revert of {sha[:10]} did not apply: {apply.stderr.strip()[:200]}"
                    return out
            code, text = pytest(scratch, python, None, shrink)
            out.file_failed = code != 0
            out.failed_tests = re.findall(r"^FAILED (\S+)", text, re.M)
            code, text = pytest(scratch, python, "machine", shrink)
            out.machine_failed = code != 0
            out.sequence = [m.group(1) for m in map(SEQUENCE.match, text.splitlines()) if m]
        finally:
            git(repo, "worktree", "remove", "--force", str(scratch))
    out.seconds = time.monotonic() - start
    return out


def report(outcomes: list[Outcome]) -> str:
    lines = ["| seam | reverted | model file | machine alone | time |", "|---|---|---|---|---|"]
    for o in outcomes:
        if o.file_failed is None:
            lines.append(f"| {o.seam} | - | {o.note} | - | - |")
            continue
        file_v = "FAILED (caught)" if o.file_failed else "passed (SURVIVED)"
        mach = "FAILED" if o.machine_failed else "passed"
        shas = ",".join(c[:10] for c in o.commits)
        lines.append(f"| {o.seam} | {shas} | {file_v} | {mach} | {o.seconds:.0f} s |")
    for o in outcomes:
        if o.failed_tests or o.sequence:
            lines.append(f"\n### seam {o.seam}: {SEAMS[o.seam]}")
            lines += [f"- failed: {t}" for t in o.failed_tests]
            if o.sequence:
                lines.append("- the machine's failing sequence:")
                lines += [f"      {s}" for s in o.sequence]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the commit to mutate (default HEAD)")
    ap.add_argument("--fix", action="append", default=[], help="SEAM=SHA[,SHA...]")
    ap.add_argument("--only", default="", help="comma-separated seams (default: all)")
    ap.add_argument("--no-shrink", action="store_true", help="report unshrunk sequences")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(argv)
    repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    base = git(repo, "rev-parse", args.base).strip()
    given: dict[str, list[str]] = {}
    for item in args.fix:
        name, _, shas = item.partition("=")
        if name not in SEAMS or not shas:
            print(f"--fix {item!r}: expected one of {', '.join(SEAMS)} = SHA[,SHA]")
            return 2
        given[name] = [git(repo, "rev-parse", s).strip() for s in shas.split(",")]
    only = [s for s in args.only.split(",") if s] or list(SEAMS)
    outcomes = []
    for seam in only:
        if seam not in SEAMS:
            print(f"unknown seam {seam!r}: one of {', '.join(SEAMS)}")
            return 2
        commits = given.get(seam) or tagged(repo, base, seam)
        print(f"seam {seam}: reverting {[c[:10] for c in commits] or 'nothing'} ...", flush=True)
        outcomes.append(run_seam(repo, base, seam, commits, args.python, not args.no_shrink))
    print(report(outcomes))
    return 1 if any(o.file_failed is False for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
