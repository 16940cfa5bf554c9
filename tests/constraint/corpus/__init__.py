"""Test support for the json= engine on real schemas (not tests themselves): the schema corpus
read from the dev extra's pip packages (schema_corpus.py), valid and invalid instances drawn
for a schema (json_instances.py), and the differential checker of `qrun.Matcher` against the
`jsonschema` validator (llg_check.py). tests/constraint/test_llg_corpus.py imports them as
`corpus.*` (pytest puts tests/constraint on the path); the benchmarks in bench/ import them as
`tests.constraint.corpus.*`, so the two share one copy and tests never import bench/."""
