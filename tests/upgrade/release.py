"""Materialise a release of echomq from this repository, with no network: its ``src`` and
``native`` trees out of git (``git archive <tag>``), run by THIS venv's python with
``PYTHONPATH=<dir>/src`` (0.4.0, 0.5.0 and this tree declare the same dependencies), and its
native module built from its own ``native/`` on first use.

A version is a tag (``v0.5.0``), or ``tree`` for the working tree itself. A clone without
tags falls back to the commit ``RELEASES`` (repo root) records for the version; when
neither object is in the clone, :class:`ReleaseMissing` says so and how to get it (a test
of the upgrade contract never skips)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = ROOT / "tests"
TREE = "tree"


class ReleaseMissing(AssertionError):
    """The release's tag and its recorded commit are both absent from this clone."""


def _git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)


def recorded_commits(root: Path = ROOT) -> dict[str, str]:
    """``RELEASES``: version -> commit (comment lines start with #)."""
    out: dict[str, str] = {}
    for line in (root / "RELEASES").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            version, commit = line.split()
            out[version] = commit
    return out


def commit_of(version: str, root: Path = ROOT) -> str:
    """The commit of ``version`` in the clone at ``root``: its tag, else the commit RELEASES
    records, if the clone has that object; else :class:`ReleaseMissing`."""
    found = _git("rev-parse", "--verify", "--quiet", f"refs/tags/{version}^{{commit}}", root=root)
    if found.returncode == 0:
        return found.stdout.decode().strip()
    known = recorded_commits(root)
    recorded = known.get(version)
    if recorded is None:
        raise ReleaseMissing(
            f"{version}: no such tag in {root} and no line for it in RELEASES "
            f"(known: {', '.join(known)})"
        )
    if _git("cat-file", "-e", f"{recorded}^{{commit}}", root=root).returncode != 0:
        raise ReleaseMissing(
            f"{version}: neither the tag nor its commit {recorded} (RELEASES) is in this "
            "clone; fetch them: git fetch --tags (or unshallow the clone)"
        )
    return recorded


@dataclass(frozen=True)
class Release:
    """One version's code on disk: ``src`` goes first on PYTHONPATH, ``native`` is the
    directory of its module's sources."""

    version: str
    src: Path
    native: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with PYTHONPATH naming this release's code first, then tests/ (the
        test apps import it from there), then whatever ``base`` had."""
        env = dict(base)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.src), str(TESTS_DIR), base.get("PYTHONPATH", "")) if p
        )
        return env

    def module(self) -> Path:
        """Its trafikey.so, built by ``make`` in its own copy of ``native/`` on first use (the
        tree's sources are built in a copy too, never in place: another process may be
        editing or loading them)."""
        so = self.native / "trafikey.so"
        if not so.exists():
            proc = subprocess.run(
                ["make", "-s", "-C", str(self.native), "trafikey.so"],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise AssertionError(
                    f"building {self.version}'s module failed:\n{proc.stdout}{proc.stderr}"
                )
        return so


def materialise(version: str, cache: Path) -> Release:
    """``version``'s src/ and native/ under ``cache/<version>`` (extracted once: a finished
    extraction leaves a ``.done`` file), by ``git archive`` of its commit; ``tree`` is this
    working tree (its native/ copied so the build never writes into it)."""
    dest = cache / version
    done = dest / ".done"
    if not done.exists():
        dest.mkdir(parents=True, exist_ok=True)
        if version == TREE:
            archive = subprocess.run(
                ["tar", "-c", "-C", str(ROOT), "--exclude=*.so", "--exclude=*.o", "native"],
                capture_output=True,
                check=True,
            ).stdout
        else:
            got = _git("archive", "--format=tar", commit_of(version), "src", "native")
            if got.returncode != 0:
                raise ReleaseMissing(f"git archive {version} failed: {got.stderr.decode()}")
            archive = got.stdout
        _extract(archive, dest)
        done.touch()
    src = ROOT / "src" if version == TREE else dest / "src"
    return Release(version, src, dest / "native")


def _extract(archive: bytes, dest: Path) -> None:
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
