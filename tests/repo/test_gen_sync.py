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
    twins = [rel for source, output, _ in _gen().PAIRS for rel in (source, output)]
    for rel in (*twins, "pyproject.toml"):
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
        "    await q.aclose()\n"
    )
    got = gen.unasync(text, "src/x.py", "twin")
    assert "def f(q: Queue) -> None:" in got and "async" not in got.replace("_async", "")
    assert "    x = h()\n" in got and "y = 1" not in got and "    z = 2\n" in got
    assert "    q.close()\n" in got and got.count('"""twin"""') == 1


def test_an_unused_substitution_fails_named(tmp_path: Path, capsys: object) -> None:
    """A rule of the table that matches nothing in any source fails the run (issue 38), in
    both modes, and the message names the rule."""
    gen = _gen()
    gen.ROOT = _copy(tmp_path)
    assert gen.main(["gen-sync", "--check"]) == 0  # every rule of the table is in use
    gen.WORDS = [*gen.WORDS, (r"\bAsyncNoSuchName\b", "NoSuchName")]
    assert gen.main(["gen-sync", "--check"]) == 1
    assert gen.main(["gen-sync"]) == 1
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "unused substitution" in err and "AsyncNoSuchName" in err
    assert err.count("unused substitution") == 2  # only the dead rule, once a run


def test_a_rule_used_by_one_source_only_is_in_use() -> None:
    """The rules are counted over every pair: a word only one twin has is not unused."""
    gen = _gen()
    used: set[int] = set()
    gen.unasync('"""d"""\nasync def f() -> None:\n    await g()\n', "x.py", "t", used)
    names = {gen.WORDS[i][0] for i in used}
    assert names == {r"\basync def ", r"\bawait "}


def test_the_event_listener_is_generated_with_its_twins_surface() -> None:
    """Issue 38: ``EventListener`` is the generated twin of ``AsyncEventListener`` (no hand
    copy), and the two offer the same public names."""
    from echomq.events import AsyncEventListener, EventListener

    pairs = {(source, output) for source, output, _ in _gen().PAIRS}
    assert ("src/echomq/ops/async_events.py", "src/echomq/ops/sync_events.py") in pairs
    assert EventListener.__module__ == "echomq.ops.sync_events"
    assert AsyncEventListener.__module__ == "echomq.ops.async_events"

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert public(EventListener) == public(AsyncEventListener) == {"on", "poll", "run", "stop"}
