"""Mutation check of the model test (issue 22, point 4): re-introduce each seam bug on a
scratch copy and show that tests/model/test_model.py fails within its CI budget.

One command, from the repository root::

    .venv/bin/python tests/model/mutations.py                 # every seam, built-in patches
    .venv/bin/python tests/model/mutations.py --only 1,reap-dedup --no-shrink
    .venv/bin/python tests/model/mutations.py --revert 5=df649c5   # revert a fix instead
    .venv/bin/python tests/model/mutations.py --waive ring   # look past an open finding (F12)

How a bug is re-introduced. By default each seam has a built-in patch (``PATCHES``): a few
exact-text edits of the *fixed* code, in Lua and in the native C twin alike (so both
executors regress), that undo the one line of the fix that matters. They are written
against the fixes of df649c5 (remove-flows: the parent-row guard as it is since the flow
marks); an edit whose anchor text is no longer there exactly once is reported ("anchor not
found": update its entry), never applied loosely.
``--revert SEAM=SHA[,SHA]`` instead reverts those commits' ``src/`` and ``native/`` changes
(the tests stay as on the base).

Everything happens in a scratch copy of ``--base`` (default HEAD) exported with
``git archive`` into a temporary directory under the system temp dir and deleted afterwards:
no worktree is registered, and neither this checkout nor any other worktree of the
repository is written. Per seam,
with PYTHONPATH=<scratch>/src (so ``echomq`` and the native module built from
``<scratch>/native`` are the mutant):

1. the whole model file at its CI budget (the three machine legs and the fixed scenarios);
2. the random machine alone (``-k machine``: every leg, no fixed scenario), so the report
   shows whether hypothesis finds the bug by itself within the CI budget, and the sequence
   it printed (shrunk; ``--no-shrink`` reports the first failing sequence unshrunk, faster).
   ``--file-only`` skips this run and reads the machine legs' verdict and sequence from the
   first (on a loaded machine, half the time).

The report is a table (seam, mutation, model file, machine alone, time) and, per seam, the
failed tests and the machine's sequence. Exit status 1 when a mutant survives (the model
file passed with the bug back in), 2 on a usage, patch or git error.

Seams:

- ``1``: a flow child counted twice (ignored death, reprocess, completion);
- ``4``: the cancel flag outlives its run (a release keeps it);
- ``5``: a re-admitted or reprocessed id reads its previous incarnation's result;
- ``remove-flows``: a child's settle writes orphan flow keys of a removed parent (F1);
- ``reap-dedup``: a debounce hands its payload to a reaped, still-leased holder (F9).

Each seam costs a CI-budget run of the model file (~40-60 s on a quiet machine), a machine
run and a build of the native module.
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
    "base": "no mutation (the baseline)",
    "1": "a flow child counted twice (ignored death, reprocess, completion)",
    "4": "the cancel flag outlives its run",
    "5": "a re-admitted/reprocessed id reads its previous result",
    "remove-flows": "a child's settle writes orphan keys of a removed parent",
    "reap-dedup": "a debounce hands its payload to a reaped, still-leased holder",
}

# seam -> [(file, the fixed code's exact text, the mutant's)]: each undoes the line of the
# fix that matters, in Lua and in the native twin.
PATCHES: dict[str, list[tuple[str, str, str]]] = {
    "1": [
        (
            "src/echomq/lua/include/compose.lua",
            "  if before == 'processed' or before == 'unsuccessful' then return end\n",
            "",
        ),
        ("native/compose.c", "    if (before == 0 || before == 1) return;\n", ""),
    ],
    "4": [
        (
            "src/echomq/lua/include/fence.lua",
            "local function release(base, id, jk, row)\n"
            "  rcall('HDEL', jk, 'lease_epoch', 'cancel')",
            "local function release(base, id, jk, row)\n  rcall('HDEL', jk, 'lease_epoch')",
        ),
        (
            "native/fence.c",
            '    emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));\n'
            '    if (emq_eqs(row[1], "active")) return emq_leave_active(e, id, row[2]);',
            '    emq_call(e, "HDEL", 2, jk, EMQ_LIT("lease_epoch"));\n'
            '    if (emq_eqs(row[1], "active")) return emq_leave_active(e, id, row[2]);',
        ),
    ],
    "5": [
        (
            "src/echomq/lua/reprocess.lua",
            "rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)\n",
            "",
        ),
        (
            "src/echomq/lua/include/admit.lua",
            "  if not fresh then rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)"
            " end\n",
            "",
        ),
        (
            "native/cmd_reprocess.c",
            "    emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id), emq_key2(e, EMQ_KP_NOTIFY, id));\n",
            "",
        ),
        (
            "native/admit.c",
            "    if (!fresh) emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id),"
            " emq_key2(e, EMQ_KP_NOTIFY, id));\n",
            "",
        ),
    ],
    "remove-flows": [
        (
            "src/echomq/lua/include/compose.lua",
            "  if not flow_parent_row(pk, mark) then return end\n"
            "  local before = flow_recorded(pk, id)",
            "  local before = flow_recorded(pk, id)",
        ),
        (
            "native/compose.c",
            "    if (!flow_parent_row(e, pk, mark)) return;\n"
            "    int before = flow_recorded(e, pk, id);",
            # (void): the build has -Werror, and mark is then unused.
            "    (void)mark;\n    int before = flow_recorded(e, pk, id);",
        ),
    ],
    "reap-dedup": [
        (
            "src/echomq/lua/include/control.lua",
            "  if row[3] then rcall('HDEL', jk, 'lease_epoch', 'cancel') end\n",
            "",
        ),
        (
            "native/control.c",
            '    if (row[2].p) emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"),'
            ' EMQ_LIT("cancel"));\n',
            "",
        ),
    ],
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
    message: str = ""
    sequence: list[str] = field(default_factory=list)
    seconds: float = 0.0


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def export(repo: Path, commit: str, into: Path) -> None:
    """A plain copy of ``commit``'s tree (no .git, nothing registered in the repository)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if archive.returncode:
        raise RuntimeError(f"git archive {commit}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def pytest(
    scratch: Path, python: str, k: str | None, shrink: bool, waive: str = ""
) -> tuple[int, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(scratch / "src") + os.pathsep + str(scratch / "tests")
    env.pop("ECHOMQ_MODEL_WAIVE", None)
    if waive:
        env["ECHOMQ_MODEL_WAIVE"] = waive
    env.pop("ECHOMQ_MODEL_DEEP", None)
    if not shrink:
        env["ECHOMQ_MODEL_NOSHRINK"] = "1"
    cmd = [
        python,
        "-m",
        "pytest",
        "tests/model/test_model.py",
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


def first_failure(text: str) -> tuple[str, list[str]]:
    """The first machine failure's assertion line and the sequence hypothesis printed (the
    longest block of ``state...`` lines: pytest may show a sequence more than once)."""
    message = ""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not message and re.match(r"^E\s+\w*(Error|Exception|Failed)\b", line):
            message = line[1:].strip()[:300]
        m = SEQUENCE.match(line)
        if m is None:
            continue
        step = m.group(1)
        if step.startswith("state = "):
            blocks.append([step])
        elif blocks and "server_agrees_with_model" not in step:
            blocks[-1].append(step)
    return message, max(blocks, key=len, default=[])


def run_seam(
    repo: Path,
    base: str,
    seam: str,
    commits: list[str],
    python: str,
    shrink: bool,
    baseline: set[str],
    waive: str = "",
    file_only: bool = False,
) -> Outcome:
    out = Outcome(seam, commits)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"emq-mut-{seam}-") as tmp:
        scratch = Path(tmp) / "tree"
        export(repo, base, scratch)
        for path, old, new in [] if commits or seam == "base" else PATCHES[seam]:
            f = scratch / path
            text = f.read_text()
            if text.count(old) != 1:
                out.note = f"anchor not found once in {path}: {old.strip()[:60]!r}"
                return out
            f.write_text(text.replace(old, new))
        for sha in reversed(commits):  # newest first, as a revert stack
            diff = git(repo, "diff", f"{sha}^", sha, "--", "src", "native")
            if not diff.strip():
                continue
            apply = subprocess.run(
                ["git", "apply", "-R", "-"],
                cwd=scratch,
                input=diff,
                capture_output=True,
                text=True,
                check=False,
            )
            if apply.returncode:
                out.note = f"revert of {sha[:10]} did not apply: {apply.stderr.strip()[:200]}"
                return out
        code, text = pytest(scratch, python, None, shrink, waive)
        out.failed_tests = re.findall(r"^FAILED (\S+)", text, re.M)
        out.file_failed = bool(set(out.failed_tests) - baseline) or (
            code != 0 and not out.failed_tests
        )
        if file_only:
            # The machine legs ran inside the file run: their verdict and sequence are read
            # from it (half the time; no verdict free of the fixed scenarios).
            legs = [t for t in out.failed_tests if "test_machine" in t]
            out.machine_failed = bool(set(legs) - baseline)
        else:
            code, text = pytest(scratch, python, "machine", shrink, waive)
            out.machine_failed = code != 0
        out.message, out.sequence = first_failure(text)
    out.seconds = time.monotonic() - start
    return out


def report(outcomes: list[Outcome]) -> str:
    lines = ["| seam | mutation | model file | machine alone | time |", "|---|---|---|---|---|"]
    for o in outcomes:
        if o.file_failed is None:
            lines.append(f"| {o.seam} | - | {o.note} | - | - |")
            continue
        file_v = "FAILED (caught)" if o.file_failed else "passed (SURVIVED)"
        mach = "FAILED" if o.machine_failed else "passed"
        shas = ",".join(c[:10] for c in o.commits) or "patch"
        lines.append(f"| {o.seam} | {shas} | {file_v} | {mach} | {o.seconds:.0f} s |")
    for o in outcomes:
        if o.failed_tests or o.sequence:
            lines.append(f"\n### seam {o.seam}: {SEAMS[o.seam]}")
            lines += [f"- failed: {t}" for t in o.failed_tests]
            if o.message:
                lines.append(f"- the machine's first failure: {o.message}")
            if o.sequence:
                lines.append("- the machine's failing sequence:")
                lines += [f"      {s}" for s in o.sequence]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the commit to mutate (default HEAD)")
    ap.add_argument(
        "--revert", action="append", default=[], help="SEAM=SHA[,SHA...]: revert, not patch"
    )
    ap.add_argument("--only", default="", help="comma-separated seams (default: all)")
    ap.add_argument("--no-shrink", action="store_true", help="report unshrunk sequences")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument(
        "--file-only",
        action="store_true",
        help="one run per seam (the model file); the machine legs' verdict and sequence are "
        "read from it instead of a second, machine-only run",
    )
    ap.add_argument(
        "--waive",
        default="",
        help="ECHOMQ_MODEL_WAIVE for every run: look past an open finding of the base "
        "(e.g. ring while FINDINGS F12 is open); never a seam's own tag",
    )
    args = ap.parse_args(argv)
    repo = Path(git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    base = git(repo, "rev-parse", args.base).strip()
    given: dict[str, list[str]] = {}
    for item in args.revert:
        name, _, shas = item.partition("=")
        if name not in SEAMS or not shas:
            print(f"--revert {item!r}: expected one of {', '.join(SEAMS)} = SHA[,SHA]")
            return 2
        given[name] = [git(repo, "rev-parse", s).strip() for s in shas.split(",")]
    only = [s for s in args.only.split(",") if s] or [s for s in SEAMS if s != "base"]
    print("base: the model file without any mutation ...", flush=True)
    shrink = not args.no_shrink
    base_out = run_seam(
        repo, base, "base", [], args.python, shrink, set(), args.waive, args.file_only
    )
    baseline = set(base_out.failed_tests)
    if baseline:
        print(f"note: on the base these already fail (not counted as catches): {sorted(baseline)}")
    outcomes = []
    for seam in only:
        if seam not in SEAMS:
            print(f"unknown seam {seam!r}: one of {', '.join(SEAMS)}")
            return 2
        commits = given.get(seam, [])
        how = f"reverting {[c[:10] for c in commits]}" if commits else "built-in patch"
        print(f"seam {seam}: {how} ...", flush=True)
        outcomes.append(
            run_seam(
                repo, base, seam, commits, args.python, shrink, baseline, args.waive, args.file_only
            )
        )
    print(report(outcomes))
    if base_out.machine_failed:
        print(
            "\nnote: the machine fails on the base too (first failure: "
            f"{base_out.message}); its verdicts above cannot be told apart from that"
        )
    if any(o.file_failed is None for o in outcomes):
        return 2
    return 1 if any(o.file_failed is False for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
