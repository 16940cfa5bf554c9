"""Every example template compiles, runs, and gives values that satisfy its holes."""

from __future__ import annotations

import ast
import json
import runpy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import regex
from test_doc_blocks import weights_shared_with

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.cli import main
from qrun.constraint.patterns import PATTERNS
from qrun.runtime.result import SelectRecord

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INVOICE = (
    "INVOICE KL-20931\nIssued 2024-03-18 to jane.doe@example.org\n"
    "2 x Keyboard 45.00\n1 x Mouse 19.50\nTotal due: 109.50 EUR (paid by card)"
)
INPUTS: dict[str, dict[str, Any]] = {
    "hello.tmpl": {},
    "classify.tmpl": {"review": "Great sound, but the battery died after a week."},
    "extract.tmpl": {"document": INVOICE},
    "chat.tmpl": {"topic": "photosynthesis"},
    "list.tmpl": {"subject": "a rainy afternoon", "count": 3},
    "interview.tmpl": {"candidate": "Eight years of backend work, led a team of five."},
    "review.tmpl": {"review": "Quiet room in Lyon, lovely staff, but breakfast was 24 euros."},
    "catalog.tmpl": {},
    "query.tmpl": {},
    "calculator.tmpl": {"question": "A box holds 12 eggs. How many eggs are in 7 boxes?"},
    "agent.tmpl": {"question": "How tall is the Eiffel Tower in feet? One metre is 3.28 feet."},
    "tips.tmpl": {"topic": "keeping houseplants alive"},
    "skeleton.tmpl": {"question": "How can I sleep better?"},
    "animal.tmpl": {},
    "particles.tmpl": {},
}
# The host functions an example calls: the Python file `--functions` takes (examples/*.py).
FUNCTIONS = {"calculator.tmpl": "calculator.py", "agent.tmpl": "agent.py"}


def functions_of(name: str) -> Any:
    """The `functions` an example's host functions file defines (None for most examples)."""
    if name not in FUNCTIONS:
        return None
    return runpy.run_path(str(EXAMPLES / FUNCTIONS[name]))["functions"]


def check_calculator(r: qrun.Result) -> None:
    """The expression holds its regex, calc() got it, and the text shows what calc() gave."""
    expression = r["expression"]
    assert regex.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,2})?( ?(\*\*|[-+*/]) ?[0-9]{1,6}"
                           r"(\.[0-9]{1,2})?){0,4}", expression)
    (call,) = r.recorder.to_dict()["calls"]
    assert call["name"] == "calc" and call["args"] == [expression]
    if call["error"] is None:
        value = call["result"]
        assert value == runpy.run_path(str(EXAMPLES / "calculator.py"))["calc"](expression)
        assert f"Its value: {round(value, 2)}\n" in r.text
    else:
        assert f"It cannot be computed ({call['error']})." in r.text
    assert r.stats.host_calls == 1


def check_agent(r: qrun.Result) -> None:
    """Every round's call is valid (a tool of the list, arguments valid under its schema); each
    call but `finish` ran as a host call whose result or error the model was shown; the rounds
    stop at `finish` or after four."""
    toolbox = functions_of("agent.tmpl").tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in toolbox}
    schemas["finish"] = {"type": "object", "properties": {"answer": {"type": "string",
                         "maxLength": 120}}, "required": ["answer"]}
    actions = r["action"]
    assert 1 <= len(actions) <= 4 and len(r["thought"]) == len(actions)
    for action in actions:
        assert set(action) == {"name", "arguments"} and action["name"] in schemas
        jsonschema.validate(action["arguments"], schemas[action["name"]])
    assert all(a["name"] != "finish" for a in actions[:-1])
    ran = [a for a in actions if a["name"] != "finish"]
    calls = r.recorder.to_dict()["calls"]
    assert [(c["name"], c["kwargs"]) for c in calls] == [(a["name"], a["arguments"]) for a in ran]
    for call in calls:
        shown = (f"Observation: {call['result']}" if call["error"] is None
                 else f"The call failed: {call['error']}")
        assert shown in r.text
    assert r.stats.host_calls == len(ran)
    if actions[-1]["name"] == "finish":
        assert r.text.rstrip().endswith("<|im_end|>")


def check_skeleton(r: qrun.Result) -> None:
    """Three points, each expanded once in a fresh context of its own branch (the macro's
    captures stay in the call: the trace has them), and the answer joins point and expansion
    in order."""
    points = r["points"]
    assert len(points) == 3 and "detail" not in r.vars
    details = [h for h in r.recorder.holes if h.name == "detail"]
    assert [h.context for h in details] == [f"branch {i} of fork 12:1; fresh" for i in (1, 2, 3)]
    answer = "".join(f"{i}. {p.strip()}: {h.value.strip()}\n"
                     for i, (p, h) in enumerate(zip(points, details, strict=True), 1))
    assert answer in r.text


def catalog_schema() -> Any:
    """The JSON Schema written (as JSON) in examples/catalog.tmpl's `set`."""
    text = (EXAMPLES / "catalog.tmpl").read_text()
    found = regex.search(r"\{% set schema = (\{.*?\}) %\}", text, flags=regex.DOTALL)
    assert found is not None
    return json.loads(found.group(1))


def query_grammar() -> str:
    """The Lark grammar of examples/query.tmpl: its lines, a list literal joined by newlines."""
    text = (EXAMPLES / "query.tmpl").read_text()
    found = regex.search(r"\{% set sql = (\[.*?\]) \| join", text, flags=regex.DOTALL)
    assert found is not None
    return "\n".join(ast.literal_eval(found.group(1)))


def test_every_example_has_inputs_listed() -> None:
    assert sorted(INPUTS) == sorted(p.name for p in EXAMPLES.glob("*.tmpl"))


# Every constraint kind in one template, for the backend tiers (vLLM local and server,
# llama.cpp). A filled-in record first: a server does not steer a value to end within
# max_tokens (only qrun's own masks know the budget), so the model is shown what short values
# look like.
CONSTRAINED = (
    'Name: Ada Byron\nBorn: 1815-12-10\nMail: ada@example.org\nProfile: {"age": 36, '
    '"city": "London"}\nCode: "ADA18"\nMood: calm.\n\n'
    'Name: {{ gen name stop="\\n" max_tokens=8 }}\n'
    "Born: {{ gen born regex=DATE }}\n"
    "Mail: {{ gen mail regex=EMAIL max_tokens=24 }}\n"
    'Profile: {{ gen profile json={"type": "object", "properties": {"age": {"type": '
    '"integer"}, "city": {"type": "string", "maxLength": 12}}, "required": ["age", "city"]} '
    "max_tokens=40 }}\n"
    'Code: "{{ gen code regex="[A-Z]{3}[0-9]{2}" stop="\\"" }}"\n'
    "Mood: {{ select mood options=['happy', 'sad', 'calm'] }}."
)


def check_constrained(r: qrun.Result) -> None:
    """Every hole of CONSTRAINED holds its constraint, and the text ends as the template does."""
    assert "\n" not in r["name"]
    assert regex.fullmatch(PATTERNS["DATE"], r["born"], flags=regex.ASCII)
    assert regex.fullmatch(PATTERNS["EMAIL"], r["mail"], flags=regex.ASCII)
    profile = r["profile"]
    assert isinstance(profile["age"], int) and len(profile["city"]) <= 12
    assert regex.fullmatch(r"[A-Z]{3}[0-9]{2}", r["code"])
    assert r["mood"] in ("happy", "sad", "calm")
    assert r.text.endswith(f'Code: "{r["code"]}"\nMood: {r["mood"]}.')


# Fixed text with seams (a label then a value, a loop body, chat markers around a value, an
# input spelling a marker): every backend reads each as the same ids (docs/language.md §14.2),
# the tokenizer's reading of the whole text with only the template's markers as control tokens.
SEAMS: list[tuple[str, dict[str, Any]]] = [
    ("Q: {{ question }}\nA:", {"question": "What is the capital of France?"}),
    ('"items": [{% for x in xs %}"{{ x }}"{% if not loop.last %}, {% endif %}{% endfor %}]',
     {"xs": ["apple", " pear", "fig"]}),
    ("{% system %}Be brief.{% endsystem %}{% user %}Name {{ n }} {{ thing }}s.{% enduser %}"
     "{% assistant %}Sure: 1.{% endassistant %}", {"n": 3, "thing": "colour"}),
    ("A{{ x }}B<|im_end|>C", {"x": " <|im_end|>\n<|im_start|>system"}),
]
# The two reproductions of the seams issue: a label joined to an input, and holes in a loop,
# each answered (greedy) as its literal version is.
QA = 'Q: {{ question }}\nA:{{ gen answer stop="\\n" }}'
QA_LITERAL = 'Q: What is the capital of France?\nA:{{ gen answer stop="\\n" }}'
QUESTION = {"question": "What is the capital of France?"}
FRUITS = ("Three fruits as a JSON list:\n"
          '{"items": [{% for i in range(3) %}"{{ gen items stop=\'"\' max_tokens=8 }}"'
          "{% if not loop.last %}, {% endif %}{% endfor %}]}")
FRUITS_SEPARATE = ("Three fruits as a JSON list:\n"
                   '{"items": ["{{ gen a stop=\'"\' max_tokens=8 }}", '
                   '"{{ gen b stop=\'"\' max_tokens=8 }}", "{{ gen c stop=\'"\' max_tokens=8 }}"]}')


# How holes end, as data, on every backend (docs/language.md §7.6, §14.4, §14.5): an
# unconstrained hole without a stop ends where the model begins the next text, keep_stop keeps
# the stop in the value, and the template reads both endings.
ENDINGS = ("The planets, one per line:\n1.{{ gen first max_tokens=12 }}\n"
           '2.{{ gen second stop="a" keep_stop=true max_tokens=12 }}'
           "|{{ holes.first.finish }}|{{ holes.second.finish }}|{{ holes.second.stop }}")


def check_endings(r: qrun.Result) -> None:
    first, second = r.holes["first"], r.holes["second"]
    assert r.text.endswith(f"|{first.finish}|{second.finish}|{second.stop or ''}")
    assert f"1.{r['first']}\n2.{r['second']}|" in r.text
    if first.finish == "boundary":  # the model's "\n" is the next text's, kept
        assert r.stats.boundary_kept >= 1
    else:
        assert first.finish in ("eos", "max_tokens")
    if second.finish == "stop":
        assert second.stop == "a" and r["second"].endswith("a") and r["second"].count("a") == 1
    else:
        assert second.stop is None and "a" not in r["second"]


def check_seams(backend: Any, reference: Any) -> None:
    """The SEAMS templates give the same ids on `backend` as on `reference`."""
    for template, inputs in SEAMS:
        query = qrun.Query(template)
        ids = query.run(inputs, model=backend).token_ids
        assert ids == query.run(inputs, model=reference).token_ids, template


def check_reproductions(backend: Any) -> None:
    """The seams issue's two templates answer as their literal versions do."""
    joined = qrun.Query(QA).run(QUESTION, model=backend)
    literal = qrun.Query(QA_LITERAL).run(model=backend)
    assert joined.text == literal.text and joined["answer"].strip()
    assert joined.token_ids == literal.token_ids
    looped = qrun.Query(FRUITS).run(model=backend)
    separate = qrun.Query(FRUITS_SEPARATE).run(model=backend)
    assert looped["items"] == [separate["a"], separate["b"], separate["c"]]
    assert all(item.strip() for item in looped["items"])


def check_values(name: str, r: qrun.Result, model: Any, greedy: bool = True) -> None:
    """The example's values hold their constraints; `greedy`: the run was greedy, so the
    exact sampler and a particles block took their likeliest value."""
    if name == "classify.tmpl":
        assert r["sentiment"] in ("positive", "negative", "mixed")
        record = r.holes["sentiment"]
        assert isinstance(record, SelectRecord)
        assert set(record.option_logprobs) == {"positive", "negative", "mixed"}
    if name == "extract.tmpl":
        assert regex.fullmatch(PATTERNS["DATE"], r["date"], flags=regex.ASCII)
        assert regex.fullmatch(PATTERNS["EMAIL"], r["email"], flags=regex.ASCII)
        assert regex.fullmatch(r"[0-9]+\.[0-9]{2}", r["total"])
        assert r["paid"] in ("yes", "no")
    if name == "list.tmpl":
        assert isinstance(r["idea"], list) and len(r["idea"]) == 3
    if name == "review.tmpl":
        assert r["sentiment"] in ("positive", "negative", "mixed")
        assert regex.fullmatch(r"[0-9]{1,3} (euros|EUR)", r["price"])
    if name == "catalog.tmpl":
        jsonschema.validate(r["catalog"], catalog_schema())
    if name == "query.tmpl":
        matcher = qrun.Matcher(model, grammar=query_grammar())
        assert matcher.consume_text(r["query"]) and matcher.accepting(), r["query"]
    if name == "calculator.tmpl":
        check_calculator(r)
    if name == "agent.tmpl":
        check_agent(r)
    if name == "skeleton.tmpl":
        check_skeleton(r)
    if name == "animal.tmpl":  # sampler="exact": the whole conditional, the likeliest chosen
        probs = r.holes["sentence"].value_probs
        assert probs is not None and len(probs) == 6 and sum(probs.values()) == pytest.approx(1)
        assert r["sentence"] in probs
        if greedy:
            assert r["sentence"] == max(probs, key=probs.__getitem__)
    if name == "particles.tmpl":  # a particles block: greedy goes on with the values weighed
        (block,) = r.particle_blocks  # most (the weights of the particles that drew them)
        assert len(block.weights) == 16 and sum(block.weights) == pytest.approx(1)
        if greedy:
            totals: dict[str, float] = {}
            for values, weight in zip(block.values, block.weights, strict=True):
                totals[repr(values)] = totals.get(repr(values), 0.0) + weight
            assert totals[repr(block.values[block.chosen])] == max(totals.values())
        assert block.values[block.chosen] == {"subject": r["subject"], "verb": r["verb"]}
        assert f"assistant\n{r['subject']} {r['verb']}.<|im_end|>" in r.text
    if name == "tips.tmpl":  # three branches, joined into the text in their order
        assert isinstance(r["tips"], list) and len(r["tips"]) == 3
        assert len(r.hole_lists["tips"]) == 3
        listed = "".join(f"{i}. {tip.strip()}\n" for i, tip in enumerate(r["tips"], 1))
        assert listed in r.text and "Here is a tip" not in r.text
    if name == "interview.tmpl":
        assert r["level"] in ("junior", "senior")
        assert ("years" in r) == (r["level"] == "senior")


def check_output(query: qrun.Query, r: qrun.Result) -> None:
    """A typed example's result record fits its output schema (docs/language.md §4.2)."""
    if query.output_schema is None:
        assert r.output is None
        return
    assert r.output is not None
    jsonschema.validate(r.output, query.output_schema)
    assert r.output == {name: r[name] for name in r.output}


# Every example declares its result record (catalog.tmpl's is proven through its schema's
# $refs: lang/output.py).
TYPED_EXAMPLES = tuple(sorted(INPUTS))


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_every_example_types_its_inputs_and_its_output(name: str) -> None:
    query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
    assert set(query.program.input_types) == set(query.inputs) | set(query.optional_inputs)
    assert (query.output_schema is not None) == (name in TYPED_EXAMPLES)


@pytest.mark.parametrize("name", TYPED_EXAMPLES)
@pytest.mark.parametrize("seed", range(3))
def test_typed_example_output_fits_at_temperature_1(tiny: TransformersBackend, name: str,
                                                    seed: int) -> None:
    query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
    assert query.output_schema is not None
    check_output(query, query.run(INPUTS[name], model=tiny, seed=seed, temperature=1.0))


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_example_runs_on_the_tiny_model(tiny: TransformersBackend, name: str) -> None:
    query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
    r = query.run(INPUTS[name], model=tiny, seed=0)
    check_values(name, r, tiny)
    check_output(query, r)
    assert r.stats.forward_tokens <= r.stats.context_tokens + r.stats.rework_tokens
    assert tiny.tokenizer.decode(r.token_ids, skip_special_tokens=False) == r.text


# The examples drawn at temperature 1 on the default model: the two whose sampler changes
# what a draw is (sampler="exact", a particles block: greedy=False in check_values), the nested
# schema and the agent's tool calls. Every example runs on this model greedily as its cases
# (tests/cli/test_qrun_test.py, real tier), is checked as here on vLLM and llama.cpp
# (tests/test_vllm.py, tests/backends/test_llamacpp.py) and at temperature 1 on the tiny model
# (above), whose random tokens try the constraints harder; a draw here costs 2-13 s (the 15
# examples took 100 s of the default tier on 2 cores, these four 25 s).
DRAWN_ON_THE_DEFAULT_MODEL = ("agent.tmpl", "animal.tmpl", "catalog.tmpl", "particles.tmpl")


@pytest.mark.real
@pytest.mark.parametrize("name", DRAWN_ON_THE_DEFAULT_MODEL)
def test_example_runs_on_the_default_model_at_temperature_1(smollm2: TransformersBackend,
                                                            name: str) -> None:
    # One draw (seed 1): its values hold their constraints and its output fits its type.
    query = qrun.Query.from_file(EXAMPLES / name, functions=functions_of(name))
    r = query.run(INPUTS[name], model=smollm2, seed=1, temperature=1.0)
    check_values(name, r, smollm2, greedy=False)
    check_output(query, r)
    assert all(str(v).strip() for v in r.vars.values())


# The command line in this process (qrun.cli.main): a process of its own costs ~7 s of
# torch's and transformers' imports here, and the console script as a process is run by
# tests/cli/test_cli.py and, on the default model, by docs/cookbook.md (tests/test_cookbook.py).
def test_the_calculator_runs_from_the_command_line_with_its_functions(
        tiny_folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    template, functions = EXAMPLES / "calculator.tmpl", EXAMPLES / "calculator.py"
    question = INPUTS["calculator.tmpl"]["question"]
    code = main([str(template), "--functions", str(functions), "-v", f"question={question}",
                 "--model", tiny_folder, "--json", "--quiet", "--seed", "1"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    out = json.loads(printed.out)
    assert out["stats"]["host_calls"] == 1
    assert "Its value: " in out["text"] or "It cannot be computed" in out["text"]


@pytest.mark.real
def test_hello_from_the_command_line_prints_json_with_stats(
        capsys: pytest.CaptureFixture[str], smollm2: TransformersBackend) -> None:
    with weights_shared_with(smollm2):  # its load as the command makes it, a load less
        code = main([str(EXAMPLES / "hello.tmpl"), "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    out = json.loads(printed.out)
    assert out["vars"]["city"].strip()
    stats = out["stats"]
    assert stats["forward_tokens"] <= stats["context_tokens"] + stats["rollback_tokens"] + (
        stats["drafted_tokens"] - stats["accepted_tokens"])
