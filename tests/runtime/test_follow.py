"""A constrained hole ends where the model begins the template's next text (docs/language.md
§14.5): at a full match, the tokens that begin the following fixed text are allowed too, and the
model writing one ends the value there; the token stays as the start of that text. On the real
SmolLM2 tokenizer with the tiny model steered to write chosen tokens (tests/doubles.py), and on a
scripted server for the replay of a server's tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from doubles import ScriptedServer, SteeredModel, script

import qrun
from qrun.backends.transformers import TransformersBackend


def scripted(tiny: TransformersBackend, before_hole: str, tokens: Sequence[int]) -> SteeredModel:
    """The tiny model, made to write `tokens` right after the text `before_hole`."""
    return SteeredModel(tiny, script(len(tiny.encode(before_hole, special=True)), tokens))


def one(tiny: TransformersBackend, text: str) -> int:
    (token_id,) = tiny.encode(text, special=True)
    return token_id


def check_context(tiny: TransformersBackend, backend: SteeredModel, result: qrun.Result) -> None:
    """The context spells the rendered text, and the last forward's logits equal one fresh
    forward of the same ids (nothing stale was kept)."""
    assert tiny.tokenizer.decode(result.token_ids, skip_special_tokens=False) == result.text
    held, logits = backend.forwards[-1]
    assert held == result.token_ids[: len(held)]
    fresh = tiny.forward(held, tiny.new_cache())[-1]
    np.testing.assert_allclose(logits, fresh, atol=1e-4, rtol=1e-4)


ORDER = ("Order: {{ gen n regex=INT max_tokens=6 heal=false }}\nEmail: "
         "{{ gen e max_tokens=2 heal=false }}")


def test_an_int_ends_where_the_model_writes_the_next_line(tiny: TransformersBackend) -> None:
    backend = scripted(tiny, "Order: ", [*tiny.encode("12"), one(tiny, "\n")])
    result = qrun.Query(ORDER).run(model=backend, speculate=False)
    assert result["n"] == 12
    record = result.holes["n"]
    assert record.finish == "boundary"
    assert record.text == "12" and tiny.decode(record.token_ids) == "12"
    assert result.text.startswith("Order: 12\nEmail: ")
    assert result.stats.boundary_kept == 1 and result.stats.boundary_dropped == 0
    # The model's "\n" is the context's: fed once, not taken back, not appended again.
    assert result.stats.rollback_tokens == 0
    assert result.token_ids.count(one(tiny, "\n")) == 1
    check_context(tiny, backend, result)


def test_without_the_rule_the_same_model_runs_on(tiny: TransformersBackend) -> None:
    # The same steering where no fixed text follows the hole: "\n" is not the INT's, so the
    # model must write digits up to max_tokens (what every constrained hole did before).
    backend = scripted(tiny, "Order: ", [*tiny.encode("12"), one(tiny, "\n")])
    result = qrun.Query("Order: {{ gen n regex=INT max_tokens=6 heal=false }}").run(
        model=backend, speculate=False)
    record = result.holes["n"]
    assert record.finish != "boundary" and "\n" not in record.text
    assert result.stats.boundary_kept == 0


def test_only_a_full_match_can_end_at_the_next_text(tiny: TransformersBackend) -> None:
    # "2024-0" is not a date yet: the "\n" the model wants is not allowed there.
    backend = scripted(tiny, "Born: ", [*tiny.encode("2024-0"), one(tiny, "\n")])
    result = qrun.Query("Born: {{ gen d regex=DATE heal=false }}\nNext").run(
        model=backend, speculate=False)
    assert result.holes["d"].finish != "boundary"
    assert len(result["d"]) == 10 and result.text == f"Born: {result['d']}\nNext"


def test_value_text_the_constraint_allows_stays_value_text(tiny: TransformersBackend) -> None:
    # "\n" is part of the regex's language: writing it continues the value.
    backend = scripted(tiny, "X: ", [one(tiny, "a"), one(tiny, "\n"), one(tiny, "b")])
    result = qrun.Query('X: {{ gen v regex="[ab\\n]{1,3}" heal=false }}\nY').run(
        model=backend, speculate=False)
    assert result["v"] == "a\nb" and result.holes["v"].finish == "match"


def test_an_unconstrained_hole_ends_at_the_next_text_too(tiny: TransformersBackend) -> None:
    # No stop of its own: the model's "\n" begins the text after the hole and ends it there,
    # kept as that text's first token (guidance's `"{{ gen name }}",` ends at the quote too).
    backend = scripted(tiny, "X: ", [one(tiny, "a"), one(tiny, "\n"), one(tiny, "b")])
    result = qrun.Query("X: {{ gen v max_tokens=3 heal=false }}\nY").run(
        model=backend, speculate=False)
    assert result["v"] == "a" and result.holes["v"].finish == "boundary"
    assert result.text == "X: a\nY" and result.stats.boundary_kept == 1
    assert result.token_ids.count(one(tiny, "\n")) == 1
    check_context(tiny, backend, result)


@pytest.mark.parametrize("hole", ['gen v max_tokens=3 heal=false ends_at_text=false',
                                  'gen v max_tokens=3 heal=false stop="b"'])
def test_an_unconstrained_hole_told_otherwise_runs_on(tiny: TransformersBackend,
                                                      hole: str) -> None:
    # ends_at_text=false, or a stop of its own: the next text does not end it.
    backend = scripted(tiny, "X: ", [one(tiny, "a"), one(tiny, "\n"), one(tiny, "b")])
    result = qrun.Query(f"X: {{{{ {hole} }}}}\nY").run(model=backend, speculate=False)
    assert result["v"] == "a\n" if "stop" in hole else result["v"] == "a\nb"
    assert result.holes["v"].finish in ("stop", "max_tokens")


def test_a_token_that_only_starts_like_the_next_text_is_value(
        tiny: TransformersBackend) -> None:
    # '",' begins with the quote but the text after the hole is '"\n': the model goes on with
    # the value, as guidance's byte-level parser does.
    backend = scripted(tiny, 'N: "', [one(tiny, "Ann"), one(tiny, '",'), one(tiny, '"')])
    result = qrun.Query('N: "{{ gen v max_tokens=4 heal=false }}"\nM').run(
        model=backend, speculate=False)
    assert result["v"] == 'Ann",' and result.holes["v"].finish == "boundary"


@pytest.mark.parametrize("template", [
    "{% if true %}N: {{ gen n regex=INT max_tokens=4 heal=false }}{% endif %};M",
    "N: {{ gen n regex=INT max_tokens=4 heal=false }}{% set k = 1 %};M",
    "{% assistant %}N: {{ gen n regex=INT max_tokens=4 heal=false }}{% endassistant %};M",
])
def test_the_next_text_is_found_past_blocks_and_sets(tiny: TransformersBackend,
                                                     template: str) -> None:
    # (A block tag's own newline is trimmed, docs/language.md §3: hence ";" here.) At the end
    # of a chat turn the next text is the turn's closing marker (EOS on SmolLM2, which ends a
    # hole anyway), so the steered ";" ends nothing there.
    before = "<|im_start|>assistant\nN: " if "assistant" in template else "N: "
    backend = scripted(tiny, before, [one(tiny, "7"), one(tiny, ";")])
    result = qrun.Query(template).run(model=backend, speculate=False)
    if "assistant" in template:
        assert result.holes["n"].finish != "boundary" and str(result["n"]).startswith("7")
    else:
        assert result["n"] == 7 and result.holes["n"].finish == "boundary"
        assert result.text == "N: 7;M"


def test_text_that_depends_on_the_run_is_not_guessed(tiny: TransformersBackend) -> None:
    # What follows depends on the value: the hole cannot end at it.
    backend = scripted(tiny, "N: ", [one(tiny, "7"), one(tiny, "\n")])
    result = qrun.Query("N: {{ gen n regex=INT max_tokens=3 heal=false }}"
                        "{% if n > 5 %}\nbig{% endif %}").run(model=backend, speculate=False)
    assert result.holes["n"].finish != "boundary" and len(result.holes["n"].token_ids) == 3


def test_a_chat_marker_that_follows_is_the_control_token_only(tiny: TransformersBackend) -> None:
    # The text after the hole begins with <|im_start|> (not EOS): the model writing that
    # control token ends the hole, and the context holds it once, as the control token.
    start = one(tiny, "<|im_start|>")
    template = ("N: {{ gen n regex=INT max_tokens=4 heal=false }}<|im_start|>user\nhi")
    backend = scripted(tiny, "N: ", [one(tiny, "4"), start])
    result = qrun.Query(template).run(model=backend, speculate=False)
    assert result["n"] == 4 and result.holes["n"].finish == "boundary"
    assert result.token_ids.count(start) == 1
    assert result.text == "N: 4<|im_start|>user\nhi"
    # The model's marker is kept as the text's own, not taken back and appended again.
    assert result.stats.boundary_kept == 1 and result.stats.boundary_dropped == 0
    # Its text spelled as ordinary tokens ("<") does not end the hole.
    backend = scripted(tiny, "N: ", [one(tiny, "4"), one(tiny, "<")])
    result = qrun.Query(template).run(model=backend, speculate=False)
    assert result.holes["n"].finish != "boundary"
    assert result.token_ids.count(start) == 1


def test_a_stop_overshoot_never_keeps_half_a_chat_marker(tiny: TransformersBackend) -> None:
    # The model writes "<" for stop="<"; the template goes on with <|im_start|>, whose text
    # begins with "<". Keeping that "<" would leave "|im_start|>" to be read as plain text.
    start = one(tiny, "<|im_start|>")
    backend = scripted(tiny, "S: ", [*tiny.encode("ab"), one(tiny, "<")])
    result = qrun.Query('S: {{ gen s stop="<" max_tokens=4 heal=false }}<|im_start|>user\nhi'
                        ).run(model=backend, speculate=False)
    assert result["s"] == "ab"
    assert result.stats.boundary_dropped == 1 and result.stats.boundary_kept == 0
    assert start in result.token_ids
    assert tiny.tokenizer.decode(result.token_ids, skip_special_tokens=False) == result.text


def test_a_json_hole_ends_at_the_next_text(tiny: TransformersBackend) -> None:
    backend = scripted(tiny, "Age: ", [*tiny.encode("42"), one(tiny, "\n")])
    result = qrun.Query('Age: {{ gen a json={"type": "integer"} max_tokens=6 heal=false }}\n'
                        'Next').run(model=backend, speculate=False)
    assert result["a"] == 42 and result.holes["a"].finish == "boundary"
    assert result.text == "Age: 42\nNext"


def test_speculation_gives_the_same_tokens(tiny: TransformersBackend) -> None:
    # The context repeats "12\n" so prompt lookup drafts the digits and the newline.
    template = ("Order: 12\nOrder: 12\nOrder: {{ gen n regex=INT max_tokens=6 }}\n"
                "Order: {{ gen m regex=INT max_tokens=6 }}\nEnd")
    steer = script(len(tiny.encode("Order: 12\nOrder: 12\nOrder:")),
                   [*tiny.encode(" 12"), one(tiny, "\n")])
    runs = [qrun.Query(template).run(model=SteeredModel(tiny, steer), speculate=on)
            for on in (False, True)]
    assert runs[0].text == runs[1].text and runs[0].token_ids == runs[1].token_ids
    assert runs[0]["n"] == 12 and runs[0].holes["n"].finish == "boundary"
    assert runs[1].stats.drafted_tokens > 0


def test_a_server_token_that_begins_the_next_text_ends_the_hole(tiny: TransformersBackend
                                                                ) -> None:
    # The server writes past the value into the next line; the replay ends the hole at the
    # first token that begins it and ignores the rest.
    server = ScriptedServer(tiny, ["12\nEmail and more"])
    result = qrun.Query("Order: {{ gen n regex=INT heal=false }}\nEmail: x").run(model=server)
    assert result["n"] == 12 and result.holes["n"].finish == "boundary"
    assert result.text == "Order: 12\nEmail: x"
    assert result.stats.boundary_kept == 1
    # The regex sent lets the server write any beginning of the next text after the value.
    assert server.requests[0]["regex"].endswith("(?:\\x0a(?:E(?:m(?:a(?:i(?:l(?::(?:\\x20(?:x)?)?"
                                                ")?)?)?)?)?)?)?")


def test_a_server_token_with_the_value_end_and_the_next_text(tiny: TransformersBackend) -> None:
    # ".<" carries the value's last byte and the first byte of "<br>".
    server = ScriptedServer(tiny, ["ok.<br>"])
    assert one(tiny, ".<") in tiny.encode("ok.<br>")
    result = qrun.Query('V: {{ gen v regex="[a-z]+\\." heal=false }}<br>').run(model=server)
    assert result["v"] == "ok." and result.holes["v"].finish == "boundary"
    assert result.text == "V: ok.<br>"
    assert tiny.tokenizer.decode(result.token_ids) == result.text


def test_a_server_ends_an_unconstrained_hole_at_the_next_text(tiny: TransformersBackend) -> None:
    # The server is told to stop after a token that begins the next text; the replay ends
    # the value before it, as a local run does.
    server = ScriptedServer(tiny, ['Ann"\nand more'])
    result = qrun.Query('N: "{{ gen v heal=false }}"\nM').run(model=server)
    assert result["v"] == "Ann" and result.holes["v"].finish == "boundary"
    assert result.text == 'N: "Ann"\nM' and result.stats.boundary_kept == 1
    assert one(tiny, '"') in server.requests[0]["stop_token_ids"]
    # With a stop of its own, no token ends it early.
    server = ScriptedServer(tiny, ['Ann"\nand more'])
    result = qrun.Query('N: "{{ gen v heal=false stop="and" }}"\nM').run(model=server)
    assert result["v"] == 'Ann"\n' and server.requests[0]["stop_token_ids"] == ()


def test_an_unconstrained_hole_ends_only_at_the_next_texts_whole_first_token(
        tiny: TransformersBackend) -> None:
    # " Q" begins " Question:" but may as well begin " QR code": only " Question" (the
    # tokenizer's first token of the text) or a longer prefix ends a hole without a
    # constraint.
    template = "A:{{ gen a max_tokens=3 heal=false }} Question: next"
    backend = scripted(tiny, "A:", [one(tiny, " Q"), one(tiny, "R"), one(tiny, " code")])
    result = qrun.Query(template).run(model=backend, speculate=False)
    assert result["a"] == " QR code" and result.holes["a"].finish == "max_tokens"
    backend = scripted(tiny, "A:", [one(tiny, " yes"), one(tiny, " Question"), one(tiny, "x")])
    result = qrun.Query(template).run(model=backend, speculate=False)
    assert result["a"] == " yes" and result.holes["a"].finish == "boundary"
    assert result.text == "A: yes Question: next" and result.stats.boundary_kept == 1


def test_a_server_is_not_stopped_inside_the_healed_prefix(tiny: TransformersBackend) -> None:
    # "Code: " heals its " ", and " 7" begins with " " as the tokenizer reads it: the lone
    # " " would stop the server at the healed prefix itself, so it is not sent; the replay
    # still ends the value at it once the prefix is written.
    server = ScriptedServer(tiny, [" X 7 and more"])
    result = qrun.Query("Code: {{ gen c }} 7").run(model=server)
    assert result["c"] == "X" and result.holes["c"].finish == "boundary"
    assert result.text == "Code: X 7"
    assert one(tiny, " ") not in server.requests[0]["stop_token_ids"]
    # Where the next text's first token is longer than the prefix, it is sent.
    server = ScriptedServer(tiny, [" Bob is"])
    result = qrun.Query("Name: {{ gen n }} is tall").run(model=server)
    assert result["n"] == "Bob" and one(tiny, " is") in server.requests[0]["stop_token_ids"]


def test_a_quote_ends_a_hole_before_a_quote_and_comma(tiny: TransformersBackend) -> None:
    # The text after the hole is '",' (one token) and the model writes '"' then "\n": only
    # punctuation, so it ends the value (the model closing the string), as in guidance.
    backend = scripted(tiny, 'N: "', [one(tiny, "Ann"), one(tiny, '"'), one(tiny, "\n")])
    result = qrun.Query('N: "{{ gen v max_tokens=4 heal=false }}",\nM').run(
        model=backend, speculate=False)
    assert result["v"] == "Ann" and result.holes["v"].finish == "boundary"
    assert result.text == 'N: "Ann",\nM'


def test_a_lone_space_before_a_number_does_not_end_a_hole(tiny: TransformersBackend) -> None:
    # SmolLM2 writes " 42" as " ", "4", "2": the " " begins " years" but is not its token.
    backend = scripted(tiny, "Age:", [one(tiny, " "), one(tiny, "4"), one(tiny, "2"),
                                      one(tiny, " years")])
    result = qrun.Query("Age:{{ gen a max_tokens=5 heal=false }} years old").run(
        model=backend, speculate=False)
    assert result["a"] == " 42" and result.holes["a"].finish == "boundary"
    assert result.text == "Age: 42 years old"


def test_a_hole_ending_an_inline_macro_call_ends_at_the_text_after_the_call(
        tiny: TransformersBackend) -> None:
    # `{{ m() }}` reads as the macro's body written in its place (docs/language.md §21.1):
    # the body's last hole may end where the model begins the text after the call.
    template = ("{% macro order() %}Order: {{ gen n regex=INT max_tokens=6 heal=false }}"
                "{% endmacro %}{{ order() }}\nEmail: {{ gen e max_tokens=2 heal=false }}")
    backend = scripted(tiny, "Order: ", [*tiny.encode("12"), one(tiny, "\n")])
    result = qrun.Query(template).run(model=backend, speculate=False)
    assert result.text.startswith("Order: 12\nEmail: ")
    assert result.recorder.holes[0].finish == "boundary"
    check_context(tiny, backend, result)


LIST = ('L: [{% for n in ["a", "b"] %}"{{ gen v max_tokens=4 heal=false }}"'
        '{% if not loop.last %}, {% endif %}{% endfor %}]')


def test_a_hole_in_a_loop_ends_at_a_token_holding_its_closing_quote_and_more(
        tiny: TransformersBackend) -> None:
    # In a loop only the `"` is sure to follow the hole (the `, ` depends on the round), and
    # SmolLM2 writes `",` as one token: it ends the value, is kept where `, ` comes next and
    # taken back before the closing `"]` (issue #38: every item ran on to max_tokens).
    first = len(tiny.encode('L: ["'))
    second = len(tiny.encode('L: ["Ann", "'))
    wanted = {first: one(tiny, "Ann"), first + 1: one(tiny, '",'),
              second: one(tiny, "Bob"), second + 1: one(tiny, '",')}

    def steer(position: int, logits: np.ndarray) -> None:
        if position in wanted:
            logits[wanted[position]] = 1e4

    backend = SteeredModel(tiny, steer)
    result = qrun.Query(LIST).run(model=backend, speculate=False)
    assert result["v"] == ["Ann", "Bob"]
    assert [hole.finish for hole in result.recorder.holes] == ["boundary", "boundary"]
    assert result.text == 'L: ["Ann", "Bob"]'
    assert result.stats.boundary_kept == 1 and result.stats.boundary_dropped == 1
    check_context(tiny, backend, result)


def test_after_a_lone_space_only_more_spaces_end_a_hole(tiny: TransformersBackend) -> None:
    # Where the next text is a lone " ", " Lee" and " (" are the value going on (a word, a
    # bracket); "  " ends it, and is taken back before the next hole.
    backend = scripted(tiny, "Name:", [one(tiny, " Ann"), one(tiny, " Lee"), one(tiny, " ("),
                                       one(tiny, "  ")])
    result = qrun.Query("Name:{{ gen v max_tokens=5 heal=false }} {{ gen w max_tokens=1 }}").run(
        model=backend, speculate=False)
    assert result["v"] == " Ann Lee (" and result.holes["v"].finish == "boundary"
    assert result.stats.boundary_dropped == 1
