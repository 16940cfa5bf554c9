"""Test cases of a template (docs/testing.md): read from `NAME.tests.yaml` beside `NAME.tmpl`,
each with its inputs, optional seed and temperature, and its expectations. The file is YAML
read by qrun/yaml_data.py's DataLoader (PyYAML's safe loader with YAML 1.2's JSON-like
scalars: `yes` and `0123` stay strings, `1e3` is a number): plain data only, no tags that
build objects, and no anchors or aliases (a few lines of aliases can expand into gigabytes).
Every error names the file, line and column of the value at fault."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from qrun.testing.expect import Expectation, parse_expectations
from qrun.testing.where import CaseFileError, Where
from qrun.yaml_data import DataLoader, load_data, screen

if TYPE_CHECKING:
    from qrun.lang.ir import Program

__all__ = ["MAX_CASE_FILE_BYTES", "Case", "CaseFileError", "Where", "cases_file_of",
           "cases_from", "front_matter_cases", "load_cases", "parse_cases"]

MAX_CASE_FILE_BYTES = 1 << 20
"""The largest case file read."""
MAX_DEPTH = 32
"""How deep lists and mappings may nest in a case file (as in front matter)."""
CASE_KEYS = ("name", "inputs", "fill", "seed", "temperature", "expect")
# A case's name: one line without ':' or control characters (they would reach the terminal
# and the JUnit XML as they are), no blank at either end.
_CONTROL = r"\x00-\x1f\x7f-\x9f"
_NAME = re.compile(rf"[^\s:{_CONTROL}]([^:{_CONTROL}]{{0,98}}[^\s:{_CONTROL}])?")


@dataclass(frozen=True)
class Case:
    """One test case: `inputs` for a run, its sampling (greedy unless `temperature` is
    given; `seed` makes a sampled case repeatable), what the result must show, and the
    values of holes it gives (`fill`: inserted, not generated; docs/language.md §16.1)."""

    name: str
    inputs: dict[str, Any]
    expectations: tuple[Expectation, ...]
    where: Where
    seed: int | None = None
    temperature: float | None = None
    fill: dict[str, Any] = field(default_factory=dict)


def cases_file_of(template: Path) -> Path:
    """The case file beside `template`: `NAME.tests.yaml` for `NAME.tmpl`."""
    return template.with_name(template.name.removesuffix(".tmpl") + ".tests.yaml")


def load_cases(path: Path) -> list[Case]:
    """The cases of the file at `path`.

    Raises:
        CaseFileError: the file cannot be read, is too large, is not YAML, uses anchors or
            aliases, or a case is malformed (with its line and column).
    """
    try:
        size = path.stat().st_size
        if size > MAX_CASE_FILE_BYTES:
            raise CaseFileError(f"{path}: {size:,} bytes, more than the "
                                f"{MAX_CASE_FILE_BYTES:,} a case file may have")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseFileError(f"{path}: cannot read it: {exc}") from None
    return parse_cases(text, str(path))


def parse_cases(text: str, file: str = "<cases>") -> list[Case]:
    """The cases of a case file's text (`file`: the name errors give).

    Raises:
        CaseFileError: as load_cases.
    """
    node = _compose(text, file)
    data = _data(text, file)
    if data is None:
        return []
    if isinstance(data, dict) and set(data) == {"tests"}:
        data, node = data["tests"], _child(node, "tests")
    return cases_from(data, lambda *path: _where(_descend(node, path), file))


def front_matter_cases(program: Program) -> list[Case]:
    """The cases of a template's front matter `tests:` (none without one).

    Raises:
        CaseFileError: as load_cases, at the place in the template.
    """
    block = program.tests
    if block is None:
        return []

    def where_of(*path: str | int) -> Where:
        span = block.span_of(tuple(path))
        return Where(program.source.name, span.line, span.column)

    return cases_from(block.data, where_of)


def cases_from(data: Any, where_of: Callable[..., Where]) -> list[Case]:
    """The cases of `data`, a list of case mappings; `where_of(*path)` is the place of the
    part at `path` (keys and indexes) below it."""
    if not isinstance(data, list):
        raise CaseFileError("tests are a list of cases (name, inputs, expect...)", where_of())
    cases: list[Case] = []
    names: set[str] = set()
    for index, item in enumerate(data):
        case = _case(item, lambda *path, i=index: where_of(i, *path), index)
        if case.name in names:
            raise CaseFileError(f"two cases are named {case.name!r}", case.where)
        names.add(case.name)
        cases.append(case)
    return cases


def _case(item: Any, where_of: Callable[..., Where], index: int) -> Case:
    where = where_of()
    if not isinstance(item, dict):
        raise CaseFileError("a case is a mapping (name, inputs, expect...)", where)
    unknown = [key for key in item if key not in CASE_KEYS]
    if unknown:
        raise CaseFileError(f"unknown key {unknown[0]!r} in a case (a case takes "
                            f"{', '.join(CASE_KEYS)})", where_of(unknown[0]))
    name = item.get("name", f"case {index + 1}")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CaseFileError("a case's name is a line of text without ':' (1-100 characters)",
                            where_of("name"))
    mappings = {}
    for key in ("inputs", "fill"):
        value = item.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise CaseFileError(f"{key} is a mapping of {'input' if key == 'inputs' else 'hole'} "
                                "names to values", where_of(key))
        mappings[key] = dict(value)
    seed = item.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise CaseFileError("seed is a whole number ≥ 0", where_of("seed"))
    temperature = item.get("temperature")
    if temperature is not None and (isinstance(temperature, bool)
                                    or not isinstance(temperature, int | float)
                                    or not 0 <= temperature <= 100):
        raise CaseFileError("temperature is a number from 0 to 100", where_of("temperature"))
    if seed is not None and temperature is None:
        raise CaseFileError("seed goes with temperature: a case without one runs greedily, "
                            "whatever the seed", where_of("seed"))
    if "expect" not in item:
        raise CaseFileError(f"case {name!r} has no `expect`: what must its result show?",
                            where)
    expectations = parse_expectations(item["expect"],
                                      lambda *path: where_of("expect", *path),
                                      where_of("expect"))
    return Case(name, mappings["inputs"], tuple(expectations), where, seed,
                None if temperature is None else float(temperature), mappings["fill"])


def _compose(text: str, file: str) -> yaml.Node | None:
    """The YAML node tree (for positions), after refusing anchors and aliases."""
    try:
        refused = screen(text, MAX_DEPTH)  # yaml_data.py
        if refused is not None:
            where = Where(file, refused.mark.line + 1, refused.mark.column + 1)
            if refused.kind == "anchor":
                raise CaseFileError("anchors and aliases (&name, *name) are not allowed in a "
                                    "case file: write the value out", where)
            if refused.kind == "tag":
                raise CaseFileError(f"YAML tags ({refused.tag}) are not allowed in a case "
                                    "file: values are JSON's types", where)
            raise CaseFileError(f"a case file nests at most {MAX_DEPTH} levels", where)
        return yaml.compose(text, Loader=DataLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None


def _data(text: str, file: str) -> Any:
    try:
        return load_data(text)  # YAML 1.2's JSON-like scalars, as front matter reads them
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None


def _yaml_error(exc: yaml.YAMLError, file: str) -> CaseFileError:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = Where(file, mark.line + 1, mark.column + 1) if mark is not None else None
    return CaseFileError(f"not valid YAML: {problem}", where)


def _where(node: yaml.Node | None, file: str) -> Where:
    if node is None:
        return Where(file, 1, 1)
    return Where(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node of `key` in mapping `node` (None where there is none)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node
    return None


def _item(node: yaml.Node | None, index: int) -> yaml.Node | None:
    if isinstance(node, yaml.SequenceNode) and index < len(node.value):
        item: yaml.Node = node.value[index]
        return item
    return None


def _descend(node: yaml.Node | None, path: Sequence[str | int]) -> yaml.Node | None:
    """The node at `path` (keys and indexes) below `node`, or the deepest one found."""
    for step in path:
        found = _item(node, step) if isinstance(step, int) else _child(node, step)
        if found is None:
            return node
        node = found
    return node
