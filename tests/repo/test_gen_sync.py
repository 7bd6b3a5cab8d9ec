"""scripts/gen-sync: Queue is generated from AsyncQueue, and ``--check`` fails on drift."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    path = ROOT / "scripts" / "gen-sync"
    loader = importlib.machinery.SourceFileLoader("gen_sync", str(path))
    spec = importlib.util.spec_from_loader("gen_sync", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _copy(tmp: Path) -> Path:
    for rel in (
        "src/echomq/client/async_queue.py",
        "src/echomq/client/sync_queue.py",
        "src/echomq/client/async_flows.py",
        "src/echomq/client/sync_flows.py",
        "pyproject.toml",
    ):
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp / rel)
    return tmp


def test_the_committed_twin_is_current() -> None:
    assert _gen().main(["gen-sync", "--check"]) == 0


def test_check_fails_on_a_hand_edit_of_the_twin(tmp_path: Path) -> None:
    gen = _gen()
    gen.ROOT = _copy(tmp_path)
    assert gen.main(["gen-sync", "--check"]) == 0  # the copy checks as the repo does
    out = tmp_path / "src/echomq/client/sync_queue.py"
    text = out.read_text()
    assert "    def claim(" in text
    out.write_text(text.replace("    def claim(", "    def claim_edited(", 1))
    assert gen.main(["gen-sync", "--check"]) == 1
    assert gen.main(["gen-sync"]) == 0  # regenerated
    assert gen.main(["gen-sync", "--check"]) == 0


def test_check_fails_when_the_source_moves_on(tmp_path: Path) -> None:
    gen = _gen()
    gen.ROOT = _copy(tmp_path)
    assert gen.main(["gen-sync", "--check"]) == 0
    src = tmp_path / "src/echomq/client/async_queue.py"
    src.write_text(src.read_text() + "\n\nasync def planted() -> None:\n    await planted()\n")
    assert gen.main(["gen-sync", "--check"]) == 1


def test_the_markers() -> None:
    gen = _gen()
    text = (
        '"""doc"""\n'
        "async def f(q: AsyncQueue) -> None:\n"
        "    x = await g()  # sync: x = h()\n"
        "    y = 1  # async-only\n"
        "    # sync-only: z = 2\n"
        "    async with q:\n"
        "        await q.aclose()\n"
    )
    got = gen.unasync(text, "src/x.py", "twin")
    assert "def f(q: Queue) -> None:" in got and "async" not in got.replace("_async", "")
    assert "    x = h()\n" in got and "y = 1" not in got and "    z = 2\n" in got
    assert "    with q:\n        q.close()\n" in got and got.count('"""twin"""') == 1
