"""The trace format's checks (qrun/trace/format.py) and its JSON writer (qrun/trace/__init__.py):
shapes, null rules, finiteness, and that the package stays free of torch."""

from __future__ import annotations

import ast
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trace_helpers import FIXTURE_NAMES

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.trace import (
    TraceFormatError,
    render_html,
    to_json,
    validate,
    write_json,
    write_trace,
)

Load = Callable[[str], dict[str, Any]]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixtures_are_valid(load_trace: Load, name: str) -> None:
    trace = load_trace(name)
    assert validate(trace) is trace


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_kept_tokens_make_the_text(load_trace: Load, name: str) -> None:
    # Not checked by validate (a token cut inside a UTF-8 character decodes to U+FFFD alone),
    # but true of every fixture: the rendered text is the kept tokens in order.
    trace = load_trace(name)
    assert "".join(e["text"] for e in trace["events"] if e["kept"]) == trace["text"]


def test_kinds_fixture_covers_the_format(load_trace: Load) -> None:
    trace = load_trace("kinds")
    events = trace["events"]
    assert {e["kind"] for e in events} == {"fixed", "sampled", "forced", "healed", "select"}
    assert {e["dropped_by"] for e in events} - {None} == {"stop", "boundary", "heal", "select"}
    assert any(e["cached"] for e in events)
    assert {h["finish"] for h in trace["holes"]} == {"stop", "match", "select"}


def _set(trace: dict[str, Any], path: str, value: object) -> None:
    """Set `events.3.prob` (dots; list indexes as numbers) to value."""
    *parents, last = path.split(".")
    node: Any = trace
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


NOT_FINITE = [
    ("events.18.logprob", math.nan, "events[18].logprob"),
    ("events.18.prob", math.inf, "events[18].prob"),
    ("events.18.top.1.logprob", -math.inf, "events[18].top[1].logprob"),
    ("stats.wall_s", math.nan, "trace.stats.wall_s"),
    ("holes.0.seconds", math.inf, "holes[0].seconds"),
    ("holes.1.value", [1.0, {"x": math.nan}], "holes[1].value[1].x"),
    ("holes.2.options.0.prob", math.nan, "holes[2].options[0].prob"),
]


@pytest.mark.parametrize(("path", "value", "named"), NOT_FINITE)
def test_a_non_finite_number_is_refused_with_its_path(
        load_trace: Load, path: str, value: object, named: str) -> None:
    trace = load_trace("kinds")
    _set(trace, path, value)
    with pytest.raises(TraceFormatError, match=r"not finite \(write null instead\)") as err:
        validate(trace)
    assert str(err.value).startswith(named)
    # The writers check first: nothing half-written, no NaN in the output.
    with pytest.raises(TraceFormatError):
        to_json(trace)
    with pytest.raises(TraceFormatError):
        render_html(trace)


BROKEN = [
    ("format", "other", "trace.format"),
    ("version", 2, "trace.version"),
    ("device", 3, "trace.device: expected str or null"),
    ("events.0.id", True, "events[0].id: expected int"),
    ("events.0.kept", 1, "events[0].kept: expected bool"),
    ("events.0.kind", "generated", "events[0].kind: expected one of"),
    ("events.0.pos", -1, "events[0].pos: negative"),
    ("events.17.dropped_by", None, "events[17].dropped_by: expected one of"),
    ("events.16.dropped_by", "stop", "events[16].dropped_by: must be null for a kept token"),
    ("events.18.prob", None, "events[18]: logprob and prob must be both null"),
    ("events.18.logprob", 0.5, "events[18].logprob: a log-probability above 0"),
    ("events.18.prob", 1.5, "events[18].prob: 1.5 is not a probability"),
    ("events.18.mask_size", 0, "events[18].mask_size: a mask that allows no token"),
    ("events.18.hole", 9, "events[18].hole: 9 is not an index into holes"),
    ("events.18.top", None, "events[18].top: expected a list"),
    ("events.32.option", 3, "events[32].option: not an index into holes[2].options"),
    ("events.32.option", None, "events[32].option: expected int"),
    ("events.18.option", 0, "events[18].option: only select tokens name an option"),
    ("events.21.pos", 20, "events[21].pos: a kept token at 19 in the final context"),
    ("holes.1.index", 0, "holes[1].index: must be its position in holes"),
    ("holes.1.first_event", 19, "holes[1]: events 19..28 out of order, overlapping"),
    ("holes.3.last_event", 99, "holes[3]: events 39..99"),
    ("holes.3.last_event", None, "holes[3]: first_event and last_event must be both null"),
    ("holes.0.options", [], "holes[0].options: must be null for a gen hole"),
    ("holes.2.options", None, "holes[2].options: expected a list"),
    ("holes.0.finish", "done", "holes[0].finish: expected one of"),
    ("holes.0.span", {"line": 3}, "holes[0].span.column: missing"),
    ("holes.0.value", {1: "x"}, "holes[0].value: key 1 is not a string"),
    ("holes.0.value", {"a", "b"}, "holes[0].value: set is not JSON data"),
]


@pytest.mark.parametrize(("path", "value", "message"), BROKEN)
def test_a_malformed_trace_is_refused_with_its_path(
        load_trace: Load, path: str, value: object, message: str) -> None:
    trace = load_trace("kinds")
    _set(trace, path, value)
    with pytest.raises(TraceFormatError) as err:
        validate(trace)
    assert str(err.value).startswith(message)


def test_a_select_token_must_sit_in_a_select_hole(load_trace: Load) -> None:
    trace = load_trace("kinds")
    trace["events"][21]["hole"] = None  # a fixed token outside any hole: allowed
    validate(trace)
    trace["events"][32]["hole"] = 0
    with pytest.raises(TraceFormatError, match=r"events\[32\].hole: a select token in a gen"):
        validate(trace)


def test_unknown_keys_are_allowed(load_trace: Load) -> None:
    trace = load_trace("kinds")
    trace["seed"] = 7
    trace["events"][0]["bytes"] = "3c7c"
    validate(trace)
    assert json.loads(to_json(trace))["seed"] == 7


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_json_round_trips(load_trace: Load, name: str, tmp_path: Path) -> None:
    trace = load_trace(name)
    write_json(trace, tmp_path / "run.json")
    text = (tmp_path / "run.json").read_text(encoding="utf-8")
    assert json.loads(text) == trace
    # One line per event and per hole: greppable for a long run.
    lines = text.splitlines()
    assert sum(line.startswith('    {"pos": ') for line in lines) == len(trace["events"])
    assert sum(line.startswith('    {"index": ') for line in lines) == len(trace["holes"])


def test_json_of_an_empty_run(load_trace: Load) -> None:
    trace = load_trace("kinds")
    trace.update(events=[], holes=[], text="")
    assert json.loads(to_json(trace)) == trace


def test_a_lone_surrogate_is_written_as_its_escape(load_trace: Load, tmp_path: Path) -> None:
    # A str read back from JSON may hold one; the file must still be UTF-8 and read back equal.
    trace = load_trace("kinds")
    trace["holes"][0]["value"] = "a\udc80b\\"
    write_json(trace, tmp_path / "run.json")
    raw = (tmp_path / "run.json").read_bytes()
    raw.decode("utf-8")
    assert json.loads(raw)["holes"][0]["value"] == "a\udc80b\\"


def test_write_trace_picks_the_format_by_suffix(load_trace: Load, tmp_path: Path) -> None:
    trace = load_trace("kinds")
    write_trace(trace, tmp_path / "run.JSON")
    write_trace(trace, tmp_path / "run.html")
    assert json.loads((tmp_path / "run.JSON").read_text(encoding="utf-8")) == trace
    assert (tmp_path / "run.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match=r"written as \.html or \.json"):
        write_trace(trace, tmp_path / "run.txt")


def test_the_trace_package_imports_no_torch() -> None:
    # qrun/trace must render anywhere (a viewer, a CI job without torch): its modules import
    # the standard library and each other only.
    package = Path(__file__).parents[2] / "qrun" / "trace"
    modules = sorted(package.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "format.py", "html.py"}
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith("qrun.trace"), (
                    f"{module.name} imports {name}")


def test_a_run_names_its_backend_as_the_flag_does(tiny: TransformersBackend) -> None:
    trace = qrun.Query("Hi {{ gen x max_tokens=1 }}").run(model=tiny).trace()
    assert trace["backend"] == "transformers" and trace["model"] == tiny.name


def test_a_hole_drawn_from_the_conditional_shows_what_it_was_drawn_from(
        tiny: TransformersBackend) -> None:
    template = ('Go:{{ gen a regex=" (cat|dog)" sampler="exact" }} and'
                '{{ gen b regex=" (cat|dog)" sampler="smc" particles=3 }}{{ select c '
                'options=[" x", " y"] }}')
    trace = qrun.Query(template).run(model=tiny, temperature=1.0, seed=2, trace=True).trace()
    exact, smc, select = trace["holes"]
    assert {v["text"] for v in exact["values"]} == {" cat", " dog"}
    assert sum(v["prob"] for v in exact["values"]) == pytest.approx(1.0)
    assert exact["log_evidence"] < 0 and "particles" not in exact
    assert len(smc["particles"]) == 3 and smc["values"]
    assert "values" not in select and "particles" not in select
    page = render_html(trace)
    assert "3 particles" in page and "log P(language)" in page
    # Its checks: a probability past 1, values on a select hole.
    broken = json.loads(json.dumps(trace))
    broken["holes"][0]["values"][0]["prob"] = 1.5
    with pytest.raises(TraceFormatError, match=r"holes\[0\].values\[0\].prob"):
        validate(broken)
    broken = json.loads(json.dumps(trace))
    broken["holes"][2]["values"] = exact["values"]
    with pytest.raises(TraceFormatError, match=r"holes\[2\].values: only a gen hole"):
        validate(broken)


def test_a_particles_block_is_in_the_trace_and_its_checks_hold(tiny: TransformersBackend
                                                               ) -> None:
    template = 'Go:{% particles 3 %}{{ gen a regex=" (cat|dog)" }}{% endparticles %} ok'
    trace = qrun.Query(template).run(model=tiny, temperature=1.0, seed=2).trace()
    (block,) = trace["particle_blocks"]
    assert block["span"] == {"line": 1, "column": 4} and len(block["particles"]) == 3
    assert sum(p["weight"] for p in block["particles"]) == pytest.approx(1.0)
    assert "particle_blocks" not in qrun.Query("Hi").run(model=tiny).trace()  # absent without
    page = render_html(trace)
    assert "<h2>Particles</h2>" in page and page.count('<tr class="chosen">') >= 1
    broken = json.loads(json.dumps(trace))
    broken["particle_blocks"][0]["chosen"] = 3
    with pytest.raises(TraceFormatError, match=r"particle_blocks\[0\].chosen: not one of"):
        validate(broken)
    broken = json.loads(json.dumps(trace))
    broken["particle_blocks"][0]["particles"][1]["weight"] = -0.5
    with pytest.raises(TraceFormatError, match=r"particle_blocks\[0\].particles\[1\].weight"):
        validate(broken)
