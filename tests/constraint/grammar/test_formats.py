"""JSON Schema formats in json= holes (qrun/constraint/grammar/formats.py): each standard format
asserted whatever the schema's draft, soundly (a string the Matcher accepts passes the
`jsonschema` format checker, with the format-nongpl extra that the dev install brings), the
common values accepted; unknown formats refused at check time with their pointer; the
"known" and "annotation" modes. Matchers run over SmolLM2's vocabulary."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qrun
from qrun.constraint.grammar import JsonFormat, JsonFormatError, check_schema
from qrun.constraint.grammar.formats import DRAFT3_FORMATS, FORMATS, assertion
from qrun.constraint.vocab import Vocabulary
from qrun.errors import ConstraintError, UsageError
from qrun.matcher import Matcher

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
DRAFT3_CHECKER = jsonschema.Draft3Validator.FORMAT_CHECKER
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT3 = "http://json-schema.org/draft-03/schema#"

# Valid values every format must accept (the common real-world ones).
VALID: dict[str, list[str]] = {
    "date": ["2024-02-29", "1999-12-31", "2000-02-29", "0001-01-01"],
    "date-time": ["2024-01-31T23:59:59Z", "2024-02-29t10:00:00.123+05:30",
                  "1970-01-01T00:00:00-00:00"],
    "time": ["12:00:00Z", "23:59:59.999+01:00", "00:00:00z"],
    "duration": ["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P4W"],
    "email": ["a@example.com", "first.last+tag@sub.example.org", "x@[192.168.0.1]"],
    "idn-email": ["josé@example.com", "用户@例子.广告", "a@b"],
    "hostname": ["example.com", "localhost", "a-b.c0.io", "x" * 63],
    "idn-hostname": ["example.com", "a-b.c", "xyz"],
    "ipv4": ["192.168.0.1", "0.0.0.0", "255.255.255.255"],
    "ipv6": ["::1", "2001:db8::8a2e:370:7334", "fe80::", "1:2:3:4:5:6:7:8"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-000000000000"],
    "uri": ["https://example.com/a/b?c=d#e", "mailto:a@b.c", "urn:isbn:0451450523",
            "http://[::1]:8080/", "file:///tmp/x"],
    "uri-reference": ["../a/b?c#d", "/x", "", "#frag", "//host:80/p", "https://e.com/%20"],
    "iri": ["http://例え.jp/パス", "https://example.com/ä?q=ü#f", "urn:x:y"],
    "iri-reference": ["パス/ä", "../a", "http://例え.jp/"],
    "uri-template": ["http://x/{id}", "/search{?q,lang}", "{+path}/here", "{x:3}{/list*}", "abc"],
    "json-pointer": ["", "/", "/a/b", "/a~0b/c~1d", "/0/ü"],
    "relative-json-pointer": ["0", "1/a", "2#", "10/x~0"],
    "regex": ["^[a-z]+$", "(a|b)*c{2,3}", r"\d+\.\d*", "^(?:[A-Z]{2})?[0-9]{1,5}$", "",
              r"[\w.-]+@[\w-]+", "(?!x)y"],
}
# Invalid values the Matcher must refuse (the checker rejects them too, but for emails: it
# asks only for an "@").
LOOSE_CHECKS = ("email", "idn-email")
INVALID: dict[str, list[str]] = {
    "date": ["2023-02-29", "0000-01-01", "2024-13-01", "2024-1-1", "24-01-01"],
    "date-time": ["2023-02-29T00:00:00Z", "2024-01-01T23:59:60Z", "2024-01-01 00:00:00Z",
                  "2024-01-01T00:00:00"],
    "time": ["12:00:60Z", "24:00:00Z", "12:00"],
    "duration": ["P", "1D", "PT", "P1H"],
    "email": ["no-at", "a@", "@b"],
    "idn-email": ["no-at", "a@-b", "a b@c"],
    "hostname": ["-a.com", "a..b", "a_b.com", ".".join(["a" * 63] * 4) + "b"],
    "idn-hostname": ["ab--cd.com", "-a", "a..b"],
    "ipv4": ["256.1.1.1", "01.1.1.1", "1.1.1"],
    "ipv6": ["1:2:3:4:5:6:7:8:9", "12345::", ":::"],
    "uuid": ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    "uri": ["no scheme", "/relative", "http://x.org/a b"],
    "uri-reference": ["http://x.org/a b", "a<b", "%zz"],
    # rfc3987-syntax refuses compressed IPv6 in an IRI (RFC 3987 allows it).
    "iri": ["/relative", "http://x/a b", "http://[::1]/"],
    "iri-reference": ["a b", "%x"],
    "uri-template": ["http://x/{", "{}", "{a b}", "{x:0}"],
    "json-pointer": ["a", "/a~2", "/~"],
    # "100" is valid by the draft, refused by jsonschema's checker (a digit after a 0).
    "relative-json-pointer": ["01", "-1", "/a", "1~", "100"],
    "regex": ["a{3,2}", "(unclosed", "a**", "[z-a]", "*a", r"\q"],
}
# Valid by the checker, refused by qrun's narrower pattern (formats.py says why for each).
NARROWED: list[tuple[str, str]] = [
    ("idn-hostname", "例え.jp"),  # U-labels are left out
    ("regex", "((((a))))"),  # groups nest 4 deep at most
]
STANDARD = sorted(VALID)


@pytest.fixture(scope="module")
def model(smol_vocab: Vocabulary) -> Any:
    return SimpleNamespace(vocabulary=smol_vocab)


def _accepts(matcher: Matcher, value: str) -> bool:
    matcher.reset()
    return matcher.consume_text(json.dumps(value, ensure_ascii=False)) and matcher.accepting()


def test_the_checker_knows_every_format() -> None:
    # Without the optional checkers jsonschema passes any string for most formats, and
    # the soundness tests below would prove nothing.
    missing = [f for f in STANDARD if f not in CHECKER.checkers]
    assert not missing, f"jsonschema lacks checkers for {missing}: pip install -e '.[dev]'"
    assert set(STANDARD) == set(FORMATS)


@pytest.mark.parametrize("fmt", STANDARD)
def test_valid_accepted_invalid_refused(model: Any, fmt: str) -> None:
    matcher = Matcher(model, json={"type": "string", "format": fmt})
    for value in VALID[fmt]:
        assert CHECKER.conforms(value, fmt), (fmt, value)
        assert _accepts(matcher, value), (fmt, value)
    for value in INVALID[fmt]:
        assert fmt in LOOSE_CHECKS or not CHECKER.conforms(value, fmt), (fmt, value)
        assert not _accepts(matcher, value), (fmt, value)


def test_narrowed_values_are_refused(model: Any) -> None:
    for fmt, value in NARROWED:
        assert CHECKER.conforms(value, fmt), (fmt, value)
        assert not _accepts(Matcher(model, json={"type": "string", "format": fmt}), value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(STANDARD), data=st.data())
def test_every_string_the_matcher_takes_passes_the_checker(model: Any, fmt: str,
                                                           data: st.DataObject) -> None:
    # A random walk through llguidance's own masks samples the strings it accepts (its own
    # format regexes included, of which no Python copy exists); ends where EOS is allowed.
    matcher = Matcher(model, json={"type": "string", "format": fmt})
    vocab = matcher.vocab
    text = b""
    for _ in range(48):
        allowed = [int(t) for t in np.flatnonzero(matcher.allowed())
                   if t not in matcher.eos_token_ids]
        if matcher.accepting() and (not allowed or data.draw(st.booleans())):
            break
        # Mostly one-byte tokens: long ones rarely leave a URI or a regex complete.
        short = [t for t in allowed if len(vocab.token_bytes[t] or b"") == 1]
        if short and data.draw(st.integers(0, 2)):
            allowed = short
        token = allowed[data.draw(st.integers(0, len(allowed) - 1))]
        assert matcher.consume(token)
        text += vocab.token_bytes[token] or b""
    if matcher.accepting():
        value = json.loads(text)
        assert CHECKER.conforms(value, fmt), (fmt, value)


# hypothesis draws from idn-email's and regex's patterns only slowly (about a minute for 20
# strings: their classes span all of Unicode, regex's nest 4 deep): the random walk above
# and the tables cover them. Strings JSON text can hold that SmolLM2's tokens can spell (it
# lacks the bytes 0xF1, 0xF2 and 0xF5-0xFF: no character past U+3FFFF). Not U+007F: llguidance
# takes DEL in a JSON string only escaped (`\u007f`, which json.dumps with ensure_ascii=False
# leaves raw), even for {"type": "string"}: fewer values, not a pattern of qrun's.
_ALPHABET = st.characters(max_codepoint=0x3FFFF, exclude_categories=["Cs"],
                          exclude_characters="\x7f")
# A range of non-ASCII characters in a class (the IRIs' and uri-template's ucschar and
# iprivate, formats.py: 60,000 code points). hypothesis's from_regex adds a class's range one
# character at a time, for each of an IRI pattern's ~40 classes: building iri-reference's
# strategy took 12 s, iri's 8 s, in every process that ran them. A wide range is drawn from a
# sample of itself instead: both ends and their neighbours, the UTF-8 length boundaries inside
# it, and 15 points spread across it; every drawn string must still full-match the pattern
# as written (test_written_patterns_are_sound).
_WIDE_RANGE = re.compile(r"([^\x00-\x7f])-([^\x00-\x7f])")


def _sampled_range(found: re.Match[str]) -> str:
    low, high = ord(found[1]), ord(found[2])
    if high - low < 256:
        return found[0]
    points = {low, low + 1, high - 1, high, *(low + (high - low) * k // 16 for k in range(1, 16))}
    points |= {p for p in (0x7FF, 0x800, 0xFFFF, 0x10000) if low <= p <= high}
    return "".join(chr(p) for p in sorted(points))


WRITTEN_PATTERNS = {f: a.pattern for f, a in sorted(FORMATS.items())
                    if a.pattern and not a.llguidance and f not in ("idn-email", "regex")}
WRITTEN = {f: st.from_regex(re.compile(_WIDE_RANGE.sub(_sampled_range, pattern)),
                            fullmatch=True, alphabet=_ALPHABET)
           for f, pattern in WRITTEN_PATTERNS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(WRITTEN))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(data=st.data())
def test_written_patterns_are_sound(model: Any, fmt: str, data: st.DataObject) -> None:
    # Strings of qrun's own pattern (read by Python's re) pass the checker, and llguidance
    # reads the pattern the same way (the Matcher takes them too).
    value = data.draw(WRITTEN[fmt])
    assert re.fullmatch(WRITTEN_PATTERNS[fmt], value), (fmt, value)  # the sample: _WIDE_RANGE
    assert CHECKER.conforms(value, fmt), (fmt, value)
    assert _accepts(Matcher(model, json={"type": "string", "format": fmt}), value), value


def test_draft04_uuid_and_date_are_asserted(model: Any) -> None:
    # Draft 4 defines neither: they were free text before (issue #24).
    for fmt, good, bad in (("uuid", "123e4567-e89b-12d3-a456-426614174000", "not-a-uuid"),
                           ("date", "2024-02-29", "2023-02-29")):
        matcher = Matcher(model, json={"$schema": DRAFT4, "type": "string", "format": fmt})
        assert _accepts(matcher, good) and not _accepts(matcher, bad)


def test_draft03_names_and_meanings(model: Any) -> None:
    cases = [("time", "12:30:00", "12:30:00Z"), ("host-name", "example.com", "-x"),
             ("ip-address", "10.0.0.1", "10.0.0"), ("color", "#a0b1c2", "#ab"),
             ("utc-millisec", "anything", None)]
    assert {name for name, *_ in cases} == set(DRAFT3_FORMATS)
    for fmt, good, bad in cases:
        matcher = Matcher(model, json={"$schema": DRAFT3, "type": "string", "format": fmt})
        assert _accepts(matcher, good), (fmt, good)
        if bad is not None:
            assert not DRAFT3_CHECKER.conforms(bad, fmt) and not _accepts(matcher, bad)
    assert assertion("host-name", 2020) is None and assertion("time", 3) != assertion("time", 7)


def test_a_format_beside_a_pattern_keeps_both(model: Any) -> None:
    # llguidance takes one pattern per string: qrun's goes into an allOf beside the user's.
    for schema, good, bad in [
        ({"type": "string", "format": "uri-reference", "pattern": "^/"}, "/a/b", "a/b"),
        ({"type": "string", "format": "date", "pattern": "^2024"}, "2024-02-29", "2023-01-01"),
        ({"type": "string", "format": "json-pointer", "pattern": "b$",
          "allOf": [{"maxLength": 4}]}, "/a/b", "/a/cb"),
        ({"type": "string", "format": "hostname", "maxLength": 5}, "a.com", "ab.com"),
    ]:
        matcher = Matcher(model, json=schema)
        assert _accepts(matcher, good), (schema, good)
        assert not _accepts(matcher, bad), (schema, bad)
    matcher = Matcher(model, json={"type": "string", "format": "date", "pattern": "^2024"})
    assert not _accepts(matcher, "2024-02-30")  # the format still holds


def test_formats_only_constrain_strings(model: Any) -> None:
    matcher = Matcher(model, json={"format": "json-pointer"})
    assert _accepts(matcher, "/a") and not _accepts(matcher, "a")
    matcher.reset()
    assert matcher.consume_text("12") and matcher.accepting()


def test_an_unknown_format_is_an_error_with_its_pointer(model: Any) -> None:
    schema = {"type": "object", "properties": {"a~b": {"type": "string", "format": "int32"}}}
    error = check_schema(schema)
    assert error is not None and error.pointer == "/properties/a~0b/format"
    assert 'unknown format "int32"' in error.reason and 'formats="annotation"' in error.reason
    with pytest.raises(ConstraintError, match=r'unknown format "int32".*/properties/a~0b/format'):
        Matcher(model, json=schema)
    error = check_schema({"$defs": {"x": {"format": 3}}})
    assert error is not None and error.pointer == "/$defs/x/format"
    # host-name is draft-03's name only.
    error = check_schema({"format": "host-name"})
    assert error is not None and error.pointer == "/format"


def test_the_format_modes(model: Any) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                               "n": {"type": "string", "format": "int32"}}}
    value = json.dumps({"id": "nope", "n": "x"})
    assert check_schema(schema, JsonFormat(formats="annotation")) is None
    assert check_schema(schema, JsonFormat(formats="known")) is None
    annotation = Matcher(model, json=schema, formats="annotation")
    assert annotation.consume_text(value) and annotation.accepting()
    known = Matcher(model, json=schema, formats="known")
    assert not (known.consume_text(value) and known.accepting())
    known.reset()
    good = json.dumps({"id": "123e4567-e89b-12d3-a456-426614174000", "n": "x"})
    assert known.consume_text(good) and known.accepting()
    wording = 'formats must be "assert", "known" or "annotation", got "loose"'
    with pytest.raises(UsageError, match=wording):
        Matcher(model, json=schema, formats="loose")
    with pytest.raises(JsonFormatError, match=wording):
        JsonFormat(formats="loose")
    with pytest.raises(JsonFormatError, match=wording):
        JsonFormat.checked(formats="loose")


# ---- the hole argument formats= (lang/args.py, runtime/constraints.py) ------------------------

UUID_SCHEMA = '{"type": "string", "format": "uuid"}'
INT32_SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer", "format": "int32"}}}'


def test_a_hole_asserts_a_format_whatever_the_draft(tiny: Any) -> None:
    schema = '{"$schema": "' + DRAFT4 + '", "type": "string", "format": "uuid"}'
    query = qrun.Query("id: {{ gen id json=" + schema + " max_tokens=40 }}")
    for seed in range(3):
        value = query.run(model=tiny, seed=seed, temperature=1.0).vars["id"]
        assert CHECKER.conforms(value, "uuid"), value


def test_an_unknown_format_is_a_compile_error_unless_formats_says_otherwise(
        tiny: Any) -> None:
    with pytest.raises(qrun.TemplateErrors) as caught:
        qrun.Query("{{ gen v json=" + INT32_SCHEMA + " }}")
    error = caught.value.errors[0]
    assert 'unknown format "int32"' in error.message
    assert "/properties/n/format" in error.message
    for mode in ("known", "annotation"):
        hole = f'formats="{mode}" max_tokens=20'
        query = qrun.Query("{{ gen v json=" + INT32_SCHEMA + " " + hole + " }}")
        value = query.run(model=tiny, seed=0).vars["v"]
        assert isinstance(value, dict)
    # "annotation" ignores the known formats too: a uuid hole then takes any string
    loose = qrun.Query("{{ gen v json=" + UUID_SCHEMA + ' formats="annotation" max_tokens=8 }}')
    assert isinstance(loose.run(model=tiny, seed=0).vars["v"], str)


@pytest.mark.parametrize(("text", "message"), [
    ('{{ gen v regex="a" formats="known" }}', "formats= applies to json= and tools= holes only"),
    ('{{ gen v json={"type": "string"} formats="loose" }}',
     'formats must be "assert", "known" or "annotation"'),
])
def test_formats_argument_errors(text: str, message: str) -> None:
    with pytest.raises(qrun.TemplateErrors, match=message):
        qrun.Query(text)


def test_formats_from_a_variable_is_checked_when_the_hole_runs(tiny: Any) -> None:
    query = qrun.Query("{{ gen v json=s formats=mode max_tokens=20 }}")
    assert isinstance(query.run({"s": INT32_SCHEMA, "mode": "known"}, model=tiny,
                                seed=0).vars["v"], dict)
    with pytest.raises(qrun.EvaluationError, match="formats must be"):
        query.run({"s": INT32_SCHEMA, "mode": "loose"}, model=tiny)
    with pytest.raises(qrun.ConstraintError, match='unknown format "int32"'):
        query.run({"s": INT32_SCHEMA, "mode": "assert"}, model=tiny)
