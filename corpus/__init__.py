"""The json= engine's real-schema corpus, shared by the tests and the benchmarks and part of
neither (tooling, not packaged): the schema corpus read from the dev extra's pip packages
(schema_corpus.py), valid and invalid instances drawn for a schema (json_instances.py), and
the differential checker of `qrun.Matcher` against the `jsonschema` validator (llg_check.py).
tests/constraint/test_llg_corpus.py and bench/ import it as `corpus.*` (the repository's root
is on the path of `python -m pytest` and `python -m bench...`), so tests never import bench/
and bench/ never imports tests/ (tests/test_structure.py)."""
