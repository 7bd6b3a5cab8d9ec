"""The repository explains itself: no product file points outside it, every relative link in
the Markdown resolves (file and heading), and every protocol citation in code and docs —
``Dn`` and ``§n`` — names a decision or section that ``docs/PROTOCOL.md`` defines."""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (
    "src",
    "docs",
    "README.md",
    "CHANGELOG.md",
    "examples",
    "bench",
    "tests",
    "pyproject.toml",
    "scripts",
)
THIS = Path(__file__).resolve()
TEXT_SUFFIXES = {".py", ".lua", ".md", ".toml", ".txt", ".html", ".css", ".js", ".mjs", ".sh", ""}


def _product_files() -> list[Path]:
    """Tracked files and new ones not ignored (the lead commits them later)."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", *PRODUCT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = [ROOT / line for line in out.splitlines() if line]
    return [f for f in files if f.is_file() and f.suffix in TEXT_SUFFIXES and f != THIS]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


# A path into a `shared/` directory (the spec and seeds live outside the repository), or an
# absolute path into the machine's work tree.
OUTSIDE = re.compile(r"(?:^|[^A-Za-z0-9_.-])(?:\.\./)*shared/|/work/")


def test_no_product_file_points_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _product_files()
        for n, line in enumerate(_text(path).splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _markdown() -> list[Path]:
    return [p for p in _product_files() if p.suffix == ".md"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation and symbols dropped (letters,
    digits, spaces, hyphens and underscores stay), spaces become hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in _text(path).splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    links: list[str] = []
    fenced = False
    for line in _text(path).splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced:
            continue
        bare = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for m in LINK.finditer(bare):
            links.append(m.group(1) or m.group(2))
    return links


def test_markdown_has_links_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _markdown()}
    assert {"README.md", "docs/API.md", "docs/PROTOCOL.md", "docs/GUARANTEES.md"} <= names
    assert _links(ROOT / "README.md"), "the README links into docs/"


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in _markdown():
        for target in _links(path):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif not dest.is_relative_to(ROOT):
                broken.append(f"{where}: outside the repository")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: no heading #{anchor}")
    assert broken == []


def test_the_api_reference_covers_the_public_surface() -> None:
    """docs/API.md names every top-level export and every public verb of both queue
    classes, so a new verb cannot ship undocumented."""
    import echomq

    api = _text(ROOT / "docs" / "API.md")
    missing = [name for name in echomq.__all__ if name not in api]
    for cls in (echomq.Queue, echomq.AsyncQueue):
        missing += [
            f"{cls.__name__}.{name}"
            for name in dir(cls)
            if not name.startswith("_")
            and callable(getattr(cls, name))
            and not re.search(rf"\b{name}\(", api)
        ]
    assert missing == []


# --------------------------------------------------------------------------- citations

PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
DECISION_CITE = re.compile(r"\bD([0-9]{1,2})\b")
SECTION_CITE = re.compile(r"§\s?([0-9]+(?:\.[0-9]+)?)")


def _defined() -> tuple[set[int], set[str]]:
    text = _text(PROTOCOL)
    decisions = {int(n) for n in re.findall(r"^- \*\*D([0-9]{1,2}) ·", text, re.M)}
    sections = set(re.findall(r"^#{2,4} §([0-9]+(?:\.[0-9]+)?) ", text, re.M))
    return decisions, sections


def test_protocol_defines_the_decisions_and_sections() -> None:
    decisions, sections = _defined()
    assert decisions == set(range(1, 26))
    assert {"0", "1", "1.2", "1.3", "3", "3.8", "6"} <= sections


def _cited_files() -> list[Path]:
    return [
        p
        for p in _product_files()
        if p.suffix in (".py", ".lua", ".md")
        and p.relative_to(ROOT).parts[0] in ("src", "tests", "docs", "README.md")
    ]


@pytest.mark.parametrize("kind", ["decision", "section"])
def test_every_citation_resolves(kind: str) -> None:
    decisions, sections = _defined()
    unresolved = []
    for path in _cited_files():
        for n, line in enumerate(_text(path).splitlines(), 1):
            if kind == "decision":
                bad = [m for m in DECISION_CITE.findall(line) if int(m) not in decisions]
            else:
                bad = [m for m in SECTION_CITE.findall(line) if m not in sections]
            unresolved += [f"{path.relative_to(ROOT)}:{n}: {kind} {b}" for b in bad]
    assert unresolved == []


def test_the_changelog_names_the_packages_version() -> None:
    """CHANGELOG.md's newest release is the version the package reports, so a bump of one
    without the other fails here."""
    import echomq

    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", _text(ROOT / "CHANGELOG.md"), re.M)
    assert releases, "CHANGELOG.md names no release"
    assert releases[0] == echomq.__version__


def test_the_twin_tables_are_generated_and_current() -> None:
    """Issue 23: the Lua -> EMQ.* twin tables of PROTOCOL §6 and native/README.md are written
    by scripts/gen-native from the scripts' headers (marked blocks), not kept by hand."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("gen_native", str(ROOT / "scripts/gen-native"))
    spec = importlib.util.spec_from_loader("gen_native", loader)
    assert spec is not None
    gen = importlib.util.module_from_spec(spec)
    loader.exec_module(gen)
    for doc in gen.DOCS:
        text = doc.read_text(encoding="utf-8")
        assert "<!-- gen-native: " in text, doc
        assert gen.rewrite_blocks(text, doc) == text, f"{doc}: run scripts/gen-native"
    # Nowhere else is the list spelled by hand: no Markdown names two EMQ.* commands in a row.
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        hand = re.findall(r"`EMQ\.[A-Z]+`,\s+`EMQ\.[A-Z]+`", _text(path))
        assert hand == [], path
