"""The documents the code cites are in the repository and say what is cited: every
`docs/NAME.md §N` in a code file names a numbered section of that file, no code file cites a
document the repository does not have, and the links and section references inside docs/ and
README.md resolve. The error messages the docs print are the ones qrun prints: every caret
stands under the column its header names, and every one-line template's error block is what
compiling (or running, on the tiny model) that line gives."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
CODE_DIRS = ("qrun", "tests", "bench", "scripts")
CODE_SUFFIXES = (".py", ".lark", ".sh")

SECTION = r"§\s?\d+(?:\.\d+)*"
# A document (or an RFC) followed by one or more sections: `docs/language.md §14.3`,
# `§2, §4.2`, `§1-§12`. Without a document the sections are the citing file's own.
CITATION = re.compile(
    rf"(?:(?P<doc>[\w./-]*\w\.md)|(?P<rfc>RFC\s?\d+))?\s*"
    rf"(?P<sections>{SECTION}(?:\s*(?:,|-|–|and)\s*{SECTION})*)"
)
MD_MENTION = re.compile(r"[\w./-]*\w\.md\b")
NUMBERED_HEADING = re.compile(r"^#{2,6} (?P<number>\d+(?:\.\d+)*)\.? \S.*$", re.M)
LINK = re.compile(r"\[(?P<label>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(?P<body>.*?)^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def code_files() -> list[Path]:
    files = [ROOT / "Makefile"]
    for folder in CODE_DIRS:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in CODE_SUFFIXES]
    return [p for p in files if p.is_file() and p != Path(__file__).resolve()]


def prose(text: str) -> str:
    """Markdown without fenced blocks and inline code (examples there are not references)."""
    blank = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keeps line numbers
    return INLINE_CODE.sub("", blank)


def blank_labels(text: str) -> str:
    """`text` with the label of every link blanked out (offsets and line numbers kept)."""

    def blank(m: re.Match[str]) -> str:
        label = m.group("label")
        return "[" + " " * len(label) + m.group(0)[len(label) + 1 :]

    return LINK.sub(blank, text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache
def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            name, n = base, 0
            while name in found:  # GitHub numbers repeated headings
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


@lru_cache
def sections(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [m.group("number") for m in NUMBERED_HEADING.finditer(text)]


def citations(text: str) -> Iterator[tuple[int, str | None, list[str], bool]]:
    """(line, document or None, section numbers, is an RFC) for every § in `text`."""
    for m in CITATION.finditer(text):
        numbers = re.findall(r"\d+(?:\.\d+)*", m.group("sections"))
        line = text.count("\n", 0, m.start("sections")) + 1
        yield line, m.group("doc"), numbers, m.group("rfc") is not None


def resolve(doc: str, citing: Path) -> Path | None:
    for base in (ROOT, citing.parent):
        target = (base / doc).resolve()
        if target.is_file() and target.is_relative_to(ROOT):
            return target
    return None


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def citation_problems(path: Path, text: str, own_sections: bool) -> list[str]:
    """What is wrong with the § references in `text` (from `path`); bare ones refer to `path`
    itself when `own_sections`, else they are an error."""
    problems = []
    for line, doc, numbers, rfc in citations(text):
        at = where(path, line)
        if rfc:
            continue
        if doc is None and not own_sections:
            problems.append(f"{at}: §{numbers[0]} does not name its document")
            continue
        target = path if doc is None else resolve(doc, path)
        if target is None:
            problems.append(f"{at}: cites {doc}, not a file in the repository")
            continue
        missing = [n for n in numbers if n not in sections(target)]
        if missing:
            problems.append(f"{at}: {target.name} has no section {', '.join(missing)}")
    return problems


def test_code_cites_numbered_sections_of_documents_in_the_repository() -> None:
    problems = []
    for path in code_files():
        problems += citation_problems(path, path.read_text(encoding="utf-8"), own_sections=False)
    assert not problems, "\n".join(problems)


def test_code_names_only_documents_in_the_repository() -> None:
    problems = []
    for path in code_files():
        text = path.read_text(encoding="utf-8")
        for m in MD_MENTION.finditer(text):
            if resolve(m.group(0), path) is None:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{where(path, line)}: {m.group(0)} is not in the repository")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_doc_sections_are_numbered_in_order_and_listed_in_its_contents(path: Path) -> None:
    numbers = sections(path)
    assert numbers, f"{path.name} has no numbered sections"
    previous: list[int] = []
    for number in numbers:
        parts = [int(p) for p in number.split(".")]
        if len(parts) > len(previous):
            expected = [*previous, 1]
        else:
            expected = [*previous[: len(parts) - 1], previous[len(parts) - 1] + 1]
        assert parts == expected, f"{path.name}: section {number} after {previous}"
        previous = parts
    text = path.read_text(encoding="utf-8")
    contents = text[: text.index("\n## ")]
    for m in NUMBERED_HEADING.finditer(FENCE.sub("", text)):
        heading = m.group(0).lstrip("#")
        assert f"(#{slug(heading)})" in contents, f"{path.name}: {heading!r} not in the contents"


@pytest.mark.parametrize("path", [*DOCS, ROOT / "README.md"], ids=lambda p: p.name)
def test_doc_links_and_section_references_resolve(path: Path) -> None:
    text = prose(path.read_text(encoding="utf-8"))
    problems = []
    for m in LINK.finditer(text):
        if re.match(r"[a-z]+:", m.group("target")):
            continue  # an external address
        file, _, anchor = m.group("target").partition("#")
        resolved = (path.parent / file).resolve() if file else path
        at = where(path, text.count("\n", 0, m.start()) + 1)
        if not resolved.exists():
            problems.append(f"{at}: link to missing {file}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{at}: no heading #{anchor} in {resolved.name}")
        elif "§" in m.group("label"):
            # `[§14.7](#147-select-scoring)`: the label's sections are the target's, and the
            # anchor is the first of them.
            numbers = re.findall(r"\d+(?:\.\d+)*", m.group("label"))
            if any(n not in sections(resolved) for n in numbers) or (
                anchor and not anchor.startswith(numbers[0].replace(".", "") + "-")
            ):
                problems.append(f"{at}: [{m.group('label')}] does not match {m.group('target')}")
    # Sections in link labels were checked against the link's target above.
    in_docs = path.parent == ROOT / "docs"
    problems += citation_problems(path, blank_labels(text), own_sections=in_docs)
    assert not problems, "\n".join(problems)


ERROR_HEAD = re.compile(r"^(?P<file>\S+?):(?P<line>\d+):(?P<col>\d+): (?:error|warning): ")


def error_blocks() -> Iterator[tuple[str, str, list[str]]]:
    """(where, header match's file, the lines from the header on) for every printed error in a
    fenced block of README.md and docs/ that shows its source line and caret."""
    for path in [ROOT / "README.md", *DOCS]:
        text = path.read_text(encoding="utf-8")
        for block in FENCE.finditer(text):
            lines = block.group("body").split("\n")
            for k, line in enumerate(lines[:-2]):
                if ERROR_HEAD.match(line) and lines[k + 2].lstrip().startswith("^"):
                    at = where(path, text.count("\n", 0, block.start("body")) + k + 1)
                    yield at, line, lines[k:]


def test_every_printed_caret_stands_at_its_column() -> None:
    wrong = []
    for at, head, lines in error_blocks():
        match = ERROR_HEAD.match(head)
        assert match is not None
        excerpt, caret = lines[1], lines[2]
        if excerpt.startswith("  …"):
            continue  # a long line shown around the column: the caret is placed for the cut
        if caret.index("^") - 1 != int(match.group("col")):
            wrong.append(f"{at}: {head} but the caret is at column {caret.index('^') - 1}")
    assert not wrong, "\n".join(wrong)


def one_line_errors() -> list[tuple[str, str, list[str]]]:
    """The printed errors of a one-line template (`t.tmpl:1:N` or `<string>:1:N`), the line
    itself shown: the block is reproducible from it."""
    return [(at, head, lines) for at, head, lines in error_blocks()
            if re.match(r"(t\.tmpl|<string>):1:", head) and not lines[1].startswith("  …")]


@pytest.mark.parametrize("at,head,lines", one_line_errors(),
                         ids=[at for at, _, _ in one_line_errors()])
def test_a_printed_error_is_what_qrun_prints(at: str, head: str, lines: list[str],
                                              tiny: Any) -> None:
    import qrun

    notes = 0
    for line in lines[3:]:
        if not line.startswith("  note: "):
            break
        notes += 1
    shown = lines[: 3 + notes]
    template, name = lines[1][2:], head.split(":")[0]
    try:
        query = qrun.Query(template, name=name)
        query.run(model=tiny)
        printed = "(the run succeeded)"
    except qrun.QrunError as exc:
        printed = str(exc)
    assert "\n".join(shown) in printed, f"{at} prints:\n" + "\n".join(shown) + \
        f"\nqrun prints:\n{printed}"


def test_one_line_errors_are_found() -> None:
    # The collection above finds the docs' printed errors (a change of their form would
    # silently test nothing).
    assert len(one_line_errors()) >= 15


def test_the_grammar_in_a_set_of_section_7_5_is_the_example_that_runs() -> None:
    # docs/language.md §7.5 shows examples/query.tmpl's grammar whole (tests/test_examples.py
    # runs the example); the two must not drift apart.
    page = (ROOT / "docs/language.md").read_text(encoding="utf-8")
    example = (ROOT / "examples/query.tmpl").read_text(encoding="utf-8")
    start = example.index("{% set sql = [")
    shown = example[start:example.index("%}", start) + 2]
    assert shown in page
