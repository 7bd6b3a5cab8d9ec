"""tests/upgrade/release.py, which the rolling-upgrade test builds old releases with: a tag
gives its commit, a clone without tags falls back to RELEASES, a clone with neither fails
with a message that says what to fetch (the contract test never skips)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from release import ROOT, ReleaseMissing, commit_of, materialise, recorded_commits


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def test_releases_names_each_tags_commit() -> None:
    """Each RELEASES line names a commit of this history whose package says that version;
    where the clone has tags (a developer's, not CI's --no-tags checkout) each agrees."""
    recorded = recorded_commits()
    assert "v0.5.0" in recorded
    for version, commit in recorded.items():
        ancestor = subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"], check=False
        )
        assert ancestor.returncode == 0, f"RELEASES: {version} {commit} is not in this history"
        init = git("-C", str(ROOT), "show", f"{commit}:src/echomq/__init__.py")
        assert f'__version__ = "{version[1:]}"' in init, f"{commit} is not {version}"
    for tag in git("-C", str(ROOT), "tag", "-l", "v*").split():
        assert recorded.get(tag) == commit_of(tag), f"RELEASES disagrees with the tag {tag}"


def test_a_clone_without_tags_uses_releases(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    git("clone", "-q", "--no-tags", "--no-checkout", str(ROOT), str(clone))
    assert not git("-C", str(clone), "tag", "-l").split()
    shutil.copy(ROOT / "RELEASES", clone / "RELEASES")
    assert commit_of("v0.5.0", clone) == recorded_commits()["v0.5.0"]


def test_neither_tag_nor_commit_fails_saying_what_to_fetch(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    git("init", "-q", str(empty))
    shutil.copy(ROOT / "RELEASES", empty / "RELEASES")
    with pytest.raises(ReleaseMissing, match=r"v0\.5\.0: neither the tag nor its commit .* fetch"):
        commit_of("v0.5.0", empty)
    with pytest.raises(ReleaseMissing, match=r"v9\.9\.9: no such tag .* no line for it"):
        commit_of("v9.9.9", empty)


def test_a_release_runs_its_own_code(tmp_path: Path) -> None:
    old = materialise("v0.5.0", tmp_path)
    env = old.env({"PATH": "/usr/bin:/bin"})
    got = subprocess.run(
        [sys.executable, "-c", "import echomq; print(echomq.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert got.strip() == "0.5.0"
