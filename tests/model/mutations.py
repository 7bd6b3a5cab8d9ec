"""Mutation check of the model test (issue 22, point 4; issue 37): re-introduce each seam bug
on a scratch copy and show that the model tests (all of tests/model/) and the fix's own
tests fail within their CI budget.

One command, from the repository root::

    .venv/bin/python tests/model/mutations.py                 # every seam, built-in patches
    .venv/bin/python tests/model/mutations.py --only 1,reap-dedup --no-shrink
    .venv/bin/python tests/model/mutations.py --revert 5=df649c5   # revert a fix instead
    .venv/bin/python tests/model/mutations.py --waive ring   # look past an open finding (F12)
    .venv/bin/python tests/model/mutations.py --no-shrink --file-only --jobs 4 --logs /tmp/m
    .venv/bin/python tests/model/mutations.py --only fold-ttl --model tests/model/test_model.py
    .venv/bin/python tests/model/mutations.py --report-logs /tmp/m   # the table again, no run

How a bug is re-introduced. By default each seam has a built-in patch (``PATCHES`` in
tests/model/mutation_seams.py): a few exact-text edits of the *fixed* code, in Lua and in
the native C twin alike (so both executors regress), that undo the one line of the fix that
matters. They are written against the fixes of df649c5 (remove-flows: the parent-row guard
as it is since the flow marks); an edit whose anchor text is no longer there exactly once is
reported ("anchor not found": update its entry), never applied loosely.
``--revert SEAM=SHA[,SHA]`` instead reverts those commits' ``src/`` and ``native/`` changes
(the tests stay as on the base).

Everything happens in a scratch copy of ``--base`` (default HEAD) exported with
``git archive`` into a temporary directory under the system temp dir and deleted afterwards:
no worktree is registered, and neither this checkout nor any other worktree of the
repository is written. Per seam,
with PYTHONPATH=<scratch>/src (so ``echomq`` and the native module built from
``<scratch>/native`` are the mutant):

1. the whole model directory at its CI budget (test_model.py's three machine legs,
   test_model_scenarios.py's fixed scenarios, and the fleet, seams and hand-back model
   files of issue 37; ``--model`` runs other model files instead), plus the seam's
   ``EXTRA`` files: the fix's own tests, which must catch it too (some seams, a
   Python-side fix, are caught there and not by a model);
2. the random machine alone (``-k machine``: every leg, no fixed scenario), so the report
   shows whether hypothesis finds the bug by itself within the CI budget, and the sequence
   it printed (shrunk; ``--no-shrink`` reports the first failing sequence unshrunk, faster).
   ``--file-only`` skips this run and reads the machine legs' verdict and sequence from the
   first (on a loaded machine, half the time).

The report is a table (seam, mutation, tests run, machine alone, time) and, per seam, the
failed tests by file and the machine's sequence. A failure the base has too does not count
as a catch, nor does ``test_every_mutation_anchor_is_in_the_tree`` (every patch fails it by
design). Exit status 1 when a mutant survives (everything it ran passed with the bug back
in, but that test), 2 on a usage, patch or git error. ``--jobs N`` runs N seams at once
(each in its own scratch copy; the base alongside, the verdicts judged against it after);
``--logs DIR`` keeps each run's pytest output as DIR/<seam>.log, and ``--report-logs DIR``
prints the table again from such logs without running anything.

Seams:

- ``1``: a flow child counted twice (ignored death, reprocess, completion);
- ``4``: the cancel flag outlives its run (a release keeps it);
- ``5``: a re-admitted or reprocessed id reads its previous incarnation's result;
- ``remove-flows``: a child's settle writes orphan flow keys of a removed parent (F1);
- ``reap-dedup``: a debounce hands its payload to a reaped, still-leased holder (F9);
- issue 37 (FINDINGS "Mutation check for issue 37"): ``resend-row``, ``occurrence-bit``,
  ``fold-ttl``, ``fold-lane``, ``limit-wake``, ``moved``, ``marker-ttl``, ``retired-ttl``,
  ``retired-bytesum``, ``handback-floor`` (see ``SEAMS``; Python-only fixes have no C edit);
- issue 38: ``progress-kept``, a reprocess that keeps the previous run's progress, and
  ``reassign-priority``, a reassign that drops the job's priority (verbs the model drives
  since issue 38: update_progress, reassign);
- issue 43: ``shard-lane``, a sharded queue that routes a lane's job by its id (the lane's
  jobs spread over the shards; test_model_sharded.py's leg).

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the model package
from model.mutation_seams import EXTRA, PATCHES, SEAMS

# test_model_scenarios.py's check that every PATCHES anchor is in the tree: a patch fails it
# by design.
ANCHOR_TEST = "test_every_mutation_anchor_is_in_the_tree"

# What every seam runs: the whole model directory (test_model.py, its scenarios and the files of
# issue 37: fleet, seams, hand-back), each at its CI budget; ``--model FILE`` narrows it.
MODEL = ["tests/model"]

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
    code: int = 0
    file_only: bool = False

    def judge(self, baseline: set[str]) -> None:
        """The verdicts, net of what already fails on the base (``baseline``) and of the
        anchor test, which every patch fails by design (the patched text is no longer the
        fixed code's): a seam only that test sees is a survivor."""
        caught = {t for t in self.failed_tests if ANCHOR_TEST not in t} - baseline
        self.file_failed = bool(caught) or (self.code != 0 and not self.failed_tests)
        if self.file_only:
            # The machine legs ran inside the file run: their verdict and sequence are read
            # from it (half the time; no verdict free of the fixed scenarios).
            legs = [t for t in self.failed_tests if is_machine(t)]
            self.machine_failed = bool(set(legs) - baseline)


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
    scratch: Path,
    python: str,
    k: str | None,
    shrink: bool,
    waive: str = "",
    targets: list[str] | None = None,
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
        *(targets or MODEL),
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


def is_machine(test: str) -> bool:
    """A random machine's leg: test_model.py's test_machine*, test_fleet_machine,
    test_handback_machine, test_model_seams (a machine without the word in its name)."""
    name = test.rsplit("::", maxsplit=1)[-1]
    return "machine" in name or name.startswith("test_model_seams")


def by_file(failed: list[str]) -> dict[str, list[str]]:
    """The failed test ids grouped by their file (``path::test`` -> path)."""
    out: dict[str, list[str]] = {}
    for t in failed:
        out.setdefault(t.split("::", 1)[0], []).append(t)
    return out


def first_failure(text: str) -> tuple[str, list[str]]:
    """The first machine failure's assertion line and the sequence hypothesis printed (the
    longest block of ``state...`` lines: pytest may show a sequence more than once)."""
    message = ""
    blocks: list[list[str]] = []
    section = ""
    for line in text.splitlines():
        head = re.match(r"^_{3,} (\S.*?) _{3,}$", line)
        if head:
            section = head.group(1)
        if ANCHOR_TEST in section:
            continue  # every patch fails it by design: not the failure to report
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
    targets: list[str] | None = None,
    logs: Path | None = None,
) -> Outcome:
    out = Outcome(seam, commits)
    targets = targets or [*MODEL, *EXTRA.get(seam, [])]
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
        code, text = pytest(scratch, python, None, shrink, waive, targets)
        if logs is not None:
            (logs / f"{seam}.log").write_text(text)
        # " - message" cut off: the ids alone, so the base's failures subtract exactly.
        out.failed_tests = re.findall(r"^(?:FAILED|ERROR) (\S+::\S+)", text, re.M)
        out.code, out.file_only = code, file_only
        out.judge(baseline)
        if not file_only:
            code, text = pytest(scratch, python, "machine", shrink, waive, list(MODEL))
            out.machine_failed = code != 0
        out.message, out.sequence = first_failure(text)
    out.seconds = time.monotonic() - start
    return out


def from_log(logs: Path, seam: str, file_only: bool) -> Outcome:
    """A seam's outcome read back from its kept pytest output (``--logs``)."""
    out = Outcome(seam, [], file_only=file_only)
    f = logs / f"{seam}.log"
    if not f.exists():
        out.note = f"no log {f}"
        return out
    text = f.read_text()
    out.failed_tests = re.findall(r"^(?:FAILED|ERROR) (\S+::\S+)", text, re.M)
    tail = text.strip().splitlines()[-1:] or [""]
    out.code = 0 if re.search(r"\bpassed\b", tail[0]) and not out.failed_tests else 1
    out.judge(set())
    out.message, out.sequence = first_failure(text)
    return out


def report(outcomes: list[Outcome]) -> str:
    lines = [
        "| seam | mutation | tests run | caught by (files, failed tests) | machine | time |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        if o.file_failed is None:
            lines.append(f"| {o.seam} | - | {o.note} | - | - | - |")
            continue
        file_v = "FAILED (caught)" if o.file_failed else "passed (SURVIVED)"
        mach = "FAILED" if o.machine_failed else "passed"
        shas = ",".join(c[:10] for c in o.commits) or "patch"
        caught = by_file([t for t in o.failed_tests if ANCHOR_TEST not in t])
        files = ", ".join(f"{Path(p).name} ({len(ts)})" for p, ts in caught.items()) or "-"
        took = f"{o.seconds:.0f} s" if o.seconds else "-"  # not kept in a --logs file
        lines.append(f"| {o.seam} | {shas} | {file_v} | {files} | {mach} | {took} |")
    for o in outcomes:
        if o.failed_tests or o.sequence:
            lines.append(f"\n### seam {o.seam}: {SEAMS[o.seam]}")
            for path, tests in by_file(o.failed_tests).items():
                lines.append(f"- {path}: {len(tests)} failed")
                lines += [f"    - {t.split('::', 1)[-1]}" for t in tests]
            if o.message:
                lines.append(f"- the first failure: {o.message}")
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
        "--model",
        action="append",
        default=[],
        help="a model file (or directory) to run instead of all of tests/model/ (repeatable); "
        "each seam's EXTRA files run as well",
    )
    ap.add_argument("--logs", type=Path, help="a directory to keep each seam's pytest output in")
    ap.add_argument(
        "--report-logs",
        type=Path,
        help="no run: the report from a --logs directory of an earlier run (times not kept)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="seams run at once (each in its own scratch copy, servers on free ports)",
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
    for seam in only:
        if seam not in SEAMS:
            print(f"unknown seam {seam!r}: one of {', '.join(SEAMS)}")
            return 2
    model = args.model or MODEL
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    # The base runs every file any chosen seam runs, so each seam's failures are net of it.
    extra = sorted({f for seam in only for f in EXTRA.get(seam, [])})
    shrink = not args.no_shrink

    def one(seam: str) -> Outcome:
        commits = given.get(seam, [])
        how = f"reverting {[c[:10] for c in commits]}" if commits else "built-in patch"
        if seam == "base":
            how, files = "no mutation", [*model, *extra]
        else:
            files = [*model, *EXTRA.get(seam, [])]
        print(f"seam {seam}: {how} ({' '.join(files)}) ...", flush=True)
        out = run_seam(
            repo,
            base,
            seam,
            commits,
            args.python,
            shrink,
            set(),
            args.waive,
            args.file_only,
            files,
            args.logs,
        )
        print(f"seam {seam}: done in {out.seconds:.0f} s", flush=True)
        return out

    if args.report_logs is not None:
        base_out, *outcomes = [
            from_log(args.report_logs, s, args.file_only) for s in ["base", *only]
        ]
    else:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            base_out, *outcomes = pool.map(one, ["base", *only])
    baseline = set(base_out.failed_tests)
    if baseline:
        print(f"note: on the base these already fail (not counted as catches): {sorted(baseline)}")
    for o in outcomes:
        if o.file_failed is not None:
            o.judge(baseline)
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
