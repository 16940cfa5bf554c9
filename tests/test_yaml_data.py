"""The YAML screen front matter and case files share (qrun/yaml_data.py `screen`): the
first anchor, alias, explicit tag or too-deep collection, with its position; nothing for
plain data; an error for what is not YAML."""

from __future__ import annotations

import pytest
import yaml

from qrun.yaml_data import Refused, screen


@pytest.mark.parametrize(("text", "kind", "line", "column", "tag"), [
    ("a: &x [1]\nb: 2\n", "anchor", 0, 3, None),
    ("a: [1]\nb: *x\n", "anchor", 1, 3, None),  # an alias alone, even one that names nothing
    ("a: !!binary aGk=\n", "tag", 0, 3, "tag:yaml.org,2002:binary"),
    ("a: !!python/object:os.system [ls]\n", "tag", 0, 3,
     "tag:yaml.org,2002:python/object:os.system"),
    ("a:\n  - !custom {b: 1}\n", "tag", 1, 4, "!custom"),
    ("a: [[[1]]]\n", "depth", 0, 5, None),  # the mapping, then three lists: the 3rd is too deep
])
def test_the_first_refused_part_and_where_it_is(text: str, kind: str, line: int, column: int,
                                                tag: str | None) -> None:
    found = screen(text, 3)
    assert isinstance(found, Refused)
    assert (found.kind, found.mark.line, found.mark.column, found.tag) == (kind, line, column,
                                                                           tag)


def test_plain_data_passes_and_depth_counts_collections_only() -> None:
    assert screen("a: [[1, 'x'], {b: null}]\nc: \"&not an anchor\"\n", 3) is None
    assert screen("a: [[1]]\n", 3) is None  # three levels: the mapping and two lists
    assert screen("", 1) is None


def test_what_is_not_yaml_raises() -> None:
    with pytest.raises(yaml.YAMLError):
        screen("a: [1\n", 8)


def test_an_alias_bomb_is_refused_at_its_first_anchor() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(20))
    found = screen(bomb, 32)
    assert found is not None and (found.kind, found.mark.line) == ("anchor", 0)
