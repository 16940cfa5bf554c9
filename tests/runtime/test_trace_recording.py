"""The runtime's trace (runtime/recorder.py, docs/trace.md): every run's trace validates, its
kept events spell exactly the final context, every hole is there with its value, and the
counts agree with the run's stats; with trace=True sampled tokens carry their alternatives."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import qrun
from qrun.backends.transformers import TransformersBackend

TEMPLATES = [
    # healing, a stop string (overshoot kept or dropped), a select, a regex with forced text
    ('Name: {{ gen n stop="\\n" max_tokens=6 }}\nAge: {{ gen a regex=INT max_tokens=3 }}.\n'
     'Paid: {{ select p options=["yes", "no", "maybe not"] }}\nCode: '
     '{{ gen c regex="ID-[0-9]{2}" }}\nEnd.'),
    # a JSON hole (fast-forwarded keys), a loop of holes, chat roles
    ('{% user %}Describe {{ who }}{% enduser %}{% assistant %}'
     '{{ gen d json=schema max_tokens=40 }}{% endassistant %}'
     '{% for i in range(3) %}\n{{ i }}: {{ gen w max_tokens=2 stop=" " }}{% endfor %}'),
    # holes back to back, an EOS-prone free hole, a stop at the very start
    '{{ gen a max_tokens=3 stop="e" }}{{ gen b max_tokens=3 stop="a" }}{{ gen c max_tokens=4 }}',
]
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["x", "ok"]}


def kept_ids(trace: dict[str, Any]) -> list[int]:
    return [e["id"] for e in trace["events"] if e["kept"]]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_trace_validates_and_spells_the_context(
    model: TransformersBackend, template: str, seed: int,
) -> None:
    r = qrun.Query(template).run(model=model, temperature=1.0, seed=seed, who="a cat",
                                 schema=SCHEMA)
    trace = r.trace()  # validated
    assert kept_ids(trace) == r.token_ids
    assert trace["text"] == r.text and trace["stats"] == r.stats.to_dict()
    names = [h["name"] for h in trace["holes"]]
    assert sorted(set(names)) == sorted(r.vars)
    for hole in trace["holes"]:
        values = r.vars[hole["name"]]
        assert hole["value"] in (values if hole["name"] in r.hole_lists else [values])
    events = trace["events"]
    forced = [e for e in events if e["kind"] == "forced"]
    assert len(forced) == r.stats.forced_tokens
    assert all(e["logprob"] is None for e in forced)
    chosen = [e for e in events if e["kind"] in ("sampled", "healed") and e["id"] not in
              model.eos_token_ids]
    assert all(e["logprob"] is not None and e["logprob"] <= 1e-4 for e in chosen)
    assert sum(e["cached"] for e in events if e["kept"]) <= r.stats.cached_tokens
    dropped = [e for e in events if not e["kept"]]
    assert all(e["dropped_by"] is not None for e in dropped)
    json.dumps(trace, allow_nan=False)  # JSON, never NaN


def test_a_selects_options_are_all_in_its_hole(tiny: TransformersBackend) -> None:
    options = ["yes", "no", "maybe not"]
    r = qrun.Query('Paid: {{ select p options=o }}').run(model=tiny, o=options)
    trace = r.trace()
    (hole,) = trace["holes"]
    assert [o["text"] for o in hole["options"]] == options
    assert math.isclose(sum(o["prob"] for o in hole["options"]), 1.0)
    tokens = trace["events"][hole["first_event"]:hole["last_event"] + 1]
    winners = {e["option"] for e in tokens if e["kept"]}
    assert winners == {options.index(r["p"])}
    assert {e["option"] for e in tokens if not e["kept"]} == set(range(3)) - winners


def test_detailed_traces_carry_masks_and_alternatives(tiny: TransformersBackend) -> None:
    template = 'Code: {{ gen c regex="[a-c]{3}" }} Note:{{ gen n max_tokens=3 heal=false }}'
    r = qrun.Query(template).run(model=tiny, temperature=1.0, seed=3, trace=True)
    events = r.trace()["events"]
    sampled = [e for e in events if e["kind"] in ("sampled", "healed")]
    assert sampled and all(e["top"] for e in sampled)
    for e in sampled:
        best = e["top"][0]["logprob"]
        assert all(alt["logprob"] <= best + 1e-6 for alt in e["top"])
        assert e["logprob"] <= best + 1e-6
    constrained = [e for e in sampled if e["hole"] == 0]
    assert constrained and all(e["mask_size"] is not None for e in constrained)
    free = [e for e in sampled if e["hole"] == 1]
    assert all(e["mask_size"] is None for e in free)
    plain = qrun.Query("Note: {{ gen n max_tokens=3 }}").run(model=tiny, temperature=1.0)
    assert all(e["top"] == [] for e in plain.trace()["events"])


def test_the_trace_renders_and_writes(tiny: TransformersBackend, tmp_path: Any) -> None:
    r = qrun.Query('<img src=x onerror=alert(7)>{{ gen x max_tokens=2 }}'
                   '{{ select s options=["<i>", "&"] }}').run(model=tiny)
    page = r.to_html()
    assert "<img src=x" not in page and page.count("<script") == 1
    r.write_trace(tmp_path / "run.json")
    r.write_trace(tmp_path / "run.html")
    assert json.loads((tmp_path / "run.json").read_text())["holes"][0]["name"] == "x"
    assert (tmp_path / "run.html").read_text().startswith("<!DOCTYPE html>")


def test_the_command_line_writes_a_trace(tiny_folder: str, tmp_path: Any) -> None:
    from qrun.cli import main

    template = tmp_path / "t.tmpl"
    template.write_text('Pick: {{ select p options=["a", "b"] }} and {{ gen x max_tokens=2 }}')
    out = tmp_path / "run.json"
    assert main([str(template), "--model", tiny_folder, "--trace", str(out), "--quiet"]) == 0
    trace = json.loads(out.read_text())
    assert [h["name"] for h in trace["holes"]] == ["p", "x"]
    assert main([str(template), "--trace", str(tmp_path / "run.txt")]) == 2
