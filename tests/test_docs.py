"""The docs hold together: every citation of the design contract names one of its headings, the contract is
cited in one form only, nothing points outside the repository or at another copy of the contract, and every
relative link of the README and docs/ reaches a file."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACT = REPO / "docs" / "design.md"
CITING = ["src", "tests", "docs", "workflow", "benchmarks", "config", "scripts", "README.md", "Snakefile"]
MAX_BYTES = 1 << 20  # prompt lists and weights are data, not prose

SECTION = r"\d+(?:\.\d+)*"
# `design.md §3.2`, `design.md §3.3-3.10`, `design.md §3.1, §3.2 and §3`
CITATION = re.compile(rf"design\.md\s+(§{SECTION}(?:-{SECTION})?(?:(?:,\s*|\s+and\s+)§{SECTION}(?:-{SECTION})?)*)")
REFERENCE = re.compile(rf"§({SECTION})(?:-({SECTION}))?")
LEGACY_WORD = "DES" + "IGN"  # spelled apart, so that this file never matches its own patterns
LEGACY = re.compile(rf"\b{LEGACY_WORD}\b(?!\.md)")
OUTSIDE = ".." + "/shared"
OTHER_CONTRACT = re.compile(rf"(?:[\w.-]+/)*{LEGACY_WORD}\.md|(?:[\w.-]+/)*design\.md")
LINK = re.compile(r"\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")


def text_files(roots=CITING):
    """(path, text) of every readable text file under `roots`."""
    for root in roots:
        top = REPO / root
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts or path.stat().st_size > MAX_BYTES:
                continue
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def headings() -> set[str]:
    """The section numbers of docs/design.md: the headings whose text begins with one (`### 3.2 Title`)."""
    found = re.findall(rf"^#{{2,6}}\s+({SECTION})\s", CONTRACT.read_text(encoding="utf-8"), flags=re.M)
    return set(found)


def citations():
    """(where, cited section) of every citation of docs/design.md; a range cites both its ends."""
    for path, text in text_files():
        for match in CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            for ref in REFERENCE.finditer(match.group(1)):
                for section in filter(None, ref.groups()):
                    yield f"{path.relative_to(REPO)}:{line}", section


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name and (REPO / name).is_file()]


def bad_references(text: str) -> list[str]:
    """What `text` says that points outside the repository, or at a contract other than docs/design.md (`design.md`
    alone is a citation of it; a path to it must end in docs/design.md)."""
    found = [m.group(0) for m in re.finditer(re.escape(OUTSIDE), text)]
    for m in OTHER_CONTRACT.finditer(text):
        ref = m.group(0)
        if LEGACY_WORD + ".md" in ref or ("/" in ref and not ref.endswith("docs/design.md")):
            found.append(ref)
    return found


def test_the_design_contract_numbers_its_sections():
    sections = headings()
    expected = {str(n) for n in range(1, 7)} | {f"3.{n}" for n in range(1, 13)}
    assert expected <= sections, sorted(expected - sections)


def test_the_citation_patterns_read_every_form():
    text = "see design.md §3.1, §3.2 and §3; design.md §3.3-3.10. docs/design.md §4's toy"
    cited = [s for m in CITATION.finditer(text) for r in REFERENCE.finditer(m.group(1)) for s in r.groups() if s]
    assert cited == ["3.1", "3.2", "3", "3.3", "3.10", "4"]
    assert LEGACY.search(f"({LEGACY_WORD} 3.2)") and not LEGACY.search(f"{LEGACY_WORD}.md")
    assert bad_references("design.md §3.2, docs/design.md, ../docs/design.md#3-the-algorithm") == []
    other = "notes/" + "design.md"  # spelled apart: this file is scanned too
    bad = f"see {OUTSIDE}/notes, {LEGACY_WORD}.md, docs/{LEGACY_WORD}.md and {other}"
    assert bad_references(bad) == [OUTSIDE, f"{LEGACY_WORD}.md", f"docs/{LEGACY_WORD}.md", other]


def test_every_citation_of_the_design_contract_names_one_of_its_headings():
    sections = headings()
    cited = list(citations())
    assert cited, "no citation of docs/design.md found: the pattern or the search roots are wrong"
    missing = [f"{where}: §{section}" for where, section in cited if section not in sections]
    assert not missing, "citations of sections docs/design.md does not have:\n" + "\n".join(missing)


def test_no_file_cites_the_design_contract_in_the_legacy_form():
    found = [
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {text[m.start() : m.start() + 30]!r}"
        for path, text in text_files()
        for m in LEGACY.finditer(text)
    ]
    assert not found, "cite it as `design.md §3.2` (docs: `docs/design.md §3.2`):\n" + "\n".join(found)


def test_no_tracked_file_points_outside_the_repository_or_at_another_contract():
    found = []
    for path in tracked_files():
        if path.stat().st_size > MAX_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(REPO)}: {ref}" for ref in bad_references(text)]
    assert not found, "\n".join(found)


def markdown_links():
    """(markdown file, link target without its anchor) of every relative link in README.md and docs/*.md."""
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for match in LINK.finditer(md.read_text(encoding="utf-8")):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor of the same page
            yield md, target.split("#", 1)[0]


def test_every_relative_link_of_the_docs_reaches_a_file():
    links = list(markdown_links())
    assert any(md.name == "README.md" for md, _ in links)
    broken = [f"{md.relative_to(REPO)}: {target}" for md, target in links if not (md.parent / target).exists()]
    assert not broken, "\n".join(broken)


def test_every_test_the_design_contract_names_exists():
    """The contract says which tests hold each invariant: a renamed or removed test must not leave it naming one."""
    defined = {path.stem for path in (REPO / "tests").glob("*.py")}  # a test file named alone
    for path in (REPO / "tests").glob("*.py"):
        defined |= set(re.findall(r"^\s*(?:def|class) (\w+)", path.read_text(), flags=re.M))
    named = set(re.findall(r"\b((?:test_|Test)[A-Za-z0-9_]+)", (REPO / "docs" / "design.md").read_text()))
    named = {n for n in named if not n.endswith("_") and n != "Tests"}  # a family ("test_slurm_*"); the word
    assert named, "docs/design.md names no test: the pattern is wrong"
    assert not named - defined, f"docs/design.md names tests that do not exist: {sorted(named - defined)}"
