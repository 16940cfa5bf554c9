"""Holes filled by a server that samples whole holes (runtime/remote.py), with a scripted
server on the tiny model's tokenizer: the replay through qrun's own cursor and stop logic,
budgets, healing, and what is sent. The real vLLM server is in tests/test_vllm.py."""

from __future__ import annotations

import pytest
from doubles import ScriptedServer

import qrun
from qrun.backends.transformers import TransformersBackend
from qrun.errors import GenerationError
from qrun.runtime.remote import overlaps


def test_the_value_ends_at_the_stop_and_later_tokens_are_ignored(
        tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, [" Paris\nand more text the server went on writing"])
    r = qrun.Query('City:{{ gen city stop="\\n" heal=false }}\nDone.').run(model=server)
    assert r["city"] == " Paris"
    assert r.text == f"City:{r['city']}\nDone."
    assert "more" not in tiny.decode(r.token_ids)
    assert r.holes["city"].finish == "stop"


def test_a_constrained_hole_sends_its_regex_and_no_stops(tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, ["2024-05-01"])
    r = qrun.Query('Date: {{ gen d regex=DATE stop="\\n" heal=false }}.').run(model=server)
    assert r["d"] == "2024-05-01"
    sent = server.requests[0]
    assert sent["stop"] == () and sent["regex"] is not None and "\\d" not in sent["regex"]


def test_a_token_outside_the_constraint_is_an_error_with_the_holes_position(
        tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, ["12ab"])
    with pytest.raises(GenerationError, match="breaks the constraint") as caught:
        qrun.Query('n={{ gen n regex="[0-9]+" heal=false }}').run(model=server)
    assert (caught.value.span.line, caught.value.span.column) == (1, 3)


def test_a_value_cut_off_before_it_matches_is_an_error(tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, ["2024-0"])
    with pytest.raises(GenerationError, match="does not complete the constraint"):
        qrun.Query("d={{ gen d regex=DATE heal=false max_tokens=6 }}").run(model=server)


def test_healing_gives_the_server_one_token_more_and_counts_only_value_tokens(
        tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, [" one two three four five six"])
    r = qrun.Query("Count: {{ gen c max_tokens=3 }}").run(model=server)
    assert r.stats.healed_tokens == 1
    assert server.requests[0]["max_tokens"] == 4
    assert len(r.holes["c"].token_ids) <= 4
    assert r.holes["c"].finish == "max_tokens"


def test_select_takes_the_best_scored_option(tiny: TransformersBackend) -> None:
    server = ScriptedServer(tiny, [], scores={"no": -0.1, "yes": -2.0})
    r = qrun.Query('Paid: {{ select p options=["yes", "no"] }}.').run(model=server)
    assert r["p"] == "no"
    assert r.text == "Paid: no."


@pytest.mark.parametrize("prefix, stops, overlap", [
    (b"\n", ("\n",), True),       # a chat turn's healed newline, stop="\n"
    (b" ", ("\n",), False),
    (b"ab", ("bc",), True),       # the stop could start inside the prefix
    (b"xa", ("abc", ","), True),
    (b"", ("\n",), False),
])
def test_stops_that_could_match_across_the_healed_prefix_stay_with_the_replay(
        prefix: bytes, stops: tuple[str, ...], overlap: bool) -> None:
    assert overlaps(prefix, stops) is overlap
