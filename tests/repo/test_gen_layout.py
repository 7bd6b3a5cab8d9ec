"""scripts/gen-layout: the README's Layout is written from the tree (issue 38), one line per
module from its docstring's first line, and ``--check`` fails when a module, a folder or a
summary changed without it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    path = ROOT / "scripts" / "gen-layout"
    loader = importlib.machinery.SourceFileLoader("gen_layout", str(path))
    spec = importlib.util.spec_from_loader("gen_layout", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _copy(gen: ModuleType, tmp: Path) -> ModuleType:
    """The generator pointed at a copy of the package and the README."""
    shutil.copytree(
        ROOT / "src" / "echomq", tmp / "src" / "echomq", ignore=shutil.ignore_patterns("*.pyc")
    )
    shutil.copy(ROOT / "README.md", tmp / "README.md")
    gen.ROOT, gen.PACKAGE, gen.README = ROOT, tmp / "src" / "echomq", tmp / "README.md"
    return gen


def test_the_committed_layout_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen-layout", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_every_module_and_folder_is_named() -> None:
    """Every module of the package is a line of the block, every folder a ``name/`` line."""
    block = _gen().render()
    package = ROOT / "src" / "echomq"
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        name = f"{path.parent.name}/" if path.name == "__init__.py" else path.name
        assert f" {name} " in block or block.count(f"\n{name}") or name == "echomq/", path
    assert block in (ROOT / "README.md").read_text()


def test_a_new_module_makes_the_layout_stale(tmp_path: Path) -> None:
    gen = _copy(_gen(), tmp_path)
    assert gen.main(["gen-layout", "--check"]) == 0  # the copy checks as the repo does
    (gen.PACKAGE / "runtime" / "planted.py").write_text('"""A planted module."""\n')
    assert gen.main(["gen-layout", "--check"]) == 1
    assert gen.main(["gen-layout"]) == 0  # rewritten
    assert "planted.py" in gen.README.read_text() and "A planted module" in gen.README.read_text()
    assert gen.main(["gen-layout", "--check"]) == 0


def test_a_changed_summary_makes_the_layout_stale(tmp_path: Path) -> None:
    gen = _copy(_gen(), tmp_path)
    path = gen.PACKAGE / "runtime" / "slots.py"
    text = path.read_text()
    path.write_text(text.replace('"""', '"""Planted summary.\n\n', 1))
    assert gen.main(["gen-layout", "--check"]) == 1


def test_a_run_on_first_line_or_an_unnamed_folder_fails(tmp_path: Path) -> None:
    gen = _copy(_gen(), tmp_path)
    planted = gen.PACKAGE / "ops" / "planted.py"
    planted.write_text('"""A summary that runs on\ninto the next line."""\n')
    with pytest.raises(gen.Stale, match="first line"):
        gen.render()
    planted.unlink()
    (gen.PACKAGE / "assets").mkdir()
    (gen.PACKAGE / "assets" / "logo.svg").write_text("<svg/>")
    with pytest.raises(gen.Stale, match="FOLDERS"):
        gen.render()
    assert gen.main(["gen-layout", "--check"]) == 1
