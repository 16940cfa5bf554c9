"""The runtime (docs/language.md §14): a RunRequest (request.py, made by `Query.request`) run on
a loaded model by its runner (runner.py, `Runner.of(backend)`, the one run path of every face)
to a Result (result.py). The executor walks the IR; the session carries the token ids and the
KV cache; hole fillers, select, healing, speculation, branches and tool calls are its parts.
Faces reach it through qrun.api, never by importing its modules (tests/test_structure.py)."""
