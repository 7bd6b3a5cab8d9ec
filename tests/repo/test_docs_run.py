"""Docs that run: every ``python``/``bash``/``sh`` block of README.md, docs/SCALING.md and
docs/guides/*.md runs here, in order, as a user pastes it, or carries an excerpt marker saying
why not. The marker convention is in tests/repo/docblocks.py and, for writers,
docs/guides/contributing-docs.md.

Each document is one test: its blocks run in one subprocess (one Python namespace, shell
blocks with ``bash -e``), from an empty directory, against a private server the test starts
(``ECHOMQ_URL``), with the venv's ``bin`` first on PATH. A failure names the document and the
line of the block's fence, with the block's traceback or output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import Block, parse, problems, runnable, to_json

from echomq.server import EmbeddedServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "SCALING.md",
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
]
DRIVER = Path(__file__).with_name("docblocks.py")


def _blocks() -> dict[str, list[Block]]:
    return {str(p.relative_to(ROOT)): parse(p, ROOT) for p in DOCS}


def test_every_block_has_a_language_and_a_valid_marker() -> None:
    found = [msg for blocks in _blocks().values() for msg in problems(blocks)]
    assert found == []


def test_the_convention_sees_every_kind_of_block() -> None:
    # The parser must find the blocks this suite relies on: a guard against a regex that
    # silently matches nothing (then every document would "pass" with nothing run).
    blocks = [b for bs in _blocks().values() for b in bs]
    assert sum(b.lang == "python" and b.kind == "run" for b in blocks) >= 20
    assert sum(b.lang in ("bash", "sh") and b.kind == "run" for b in blocks) >= 3
    assert any(b.kind == "excerpt" for b in blocks)
    assert any("file" in b.options for b in blocks)


RUNNABLE = [d for d, bs in _blocks().items() if runnable(bs)]


def run_document(
    doc: str, tmp_path: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    steps = runnable(_blocks()[doc])
    srv = EmbeddedServer(tmp_path / "redis", appendonly=False).start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        spec = tmp_path / "steps.json"
        spec.write_text(to_json(steps), encoding="utf-8")
        env = dict(os.environ)
        env["ECHOMQ_URL"] = srv.url
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # The package under test, whatever the editable install points at.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        return subprocess.run(
            [sys.executable, str(DRIVER), str(spec)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,  # the return code is asserted with the output in the message
        )
    finally:
        srv.stop()


@pytest.mark.parametrize("doc", RUNNABLE)
def test_document_runs(doc: str, tmp_path: Path) -> None:
    done = run_document(doc, tmp_path)
    assert done.returncode == 0, f"{doc}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
