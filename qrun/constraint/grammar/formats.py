"""How each JSON Schema `format` is asserted in a json= hole: by llguidance's own regex for the
format, by a `pattern` qrun writes, or both (llguidance's regex narrowed by qrun's where it
accepts strings the `jsonschema` format checker rejects). The rewrite (rewrite.py) applies it;
tests/constraint/grammar/test_formats.py checks every accepted string against the checker.

Each pattern is a regex in llguidance's dialect (ECMA-style, matched in a JSON Schema
`pattern`) that is also Python `re` syntax, anchored here with `^(?:...)$`. Sound: every string
it accepts passes `jsonschema.FormatChecker` with the `format-nongpl` extra (rfc3986-validator,
rfc3987-syntax, rfc3339-validator, uri-template, jsonpointer, fqdn, idna); where the standard
and the checker differ, the pattern takes the intersection (each place says so)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DRAFT3_FORMATS", "FORMATS", "MODES", "Assertion", "assertion"]

# "assert": every format asserted, an unknown one is an error; "known": the known ones
# asserted, unknown ones ignored (what jsonschema's FormatChecker does); "annotation": every
# format ignored (JSON Schema's default reading of the keyword).
MODES = ("assert", "known", "annotation")


@dataclass(frozen=True, slots=True)
class Assertion:
    """How one format is asserted: `llguidance` keeps the `format` keyword for llguidance's
    own regex; `pattern` (a full-match regex) and `max_length` are added to the subschema.
    Nothing set: the format says nothing about strings (draft-03's utc-millisec)."""

    llguidance: bool = False
    pattern: str | None = None
    max_length: int | None = None


def assertion(name: str, draft: int) -> Assertion | None:
    """How format `name` is asserted in a schema of `draft` (schema.py draft_of), or None
    when qrun does not know it."""
    if draft == 3 and name in DRAFT3_FORMATS:
        return DRAFT3_FORMATS[name]
    if name == "utc-millisec":  # used beyond draft 3, and always about numbers
        return DRAFT3_FORMATS[name]
    return FORMATS.get(name)


def _full(regex: str) -> str:
    return f"^(?:{regex})$"


# --- Building blocks (RFC 3986 names) ---
_HEX = "[0-9A-Fa-f]"
_PCT = f"%{_HEX}{{2}}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
])
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = "!$&'()*+,;="
# BMP only: rfc3987-syntax's ucschar and iprivate stop at U+FFEF (RFC 3987 goes on to
# U+EFFFD).
_UCSCHAR = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
_IPRIVATE = "\ue000-\uf8ff"


def _reference(extra: str, ip_literal: str, absolute: bool, query_extra: str = "") -> str:
    """An RFC 3986 URI (`absolute`) or URI-reference; an RFC 3987 IRI (-reference) with the
    characters `extra` (ucschar) in unreserved and `query_extra` (iprivate) in the query."""
    unreserved = f"{_UNRESERVED}{extra}"
    pchar = f"(?:[{unreserved}{_SUB_DELIMS}:@]|{_PCT})"
    authority = (f"(?:(?:[{unreserved}{_SUB_DELIMS}:]|{_PCT})*@)?"
                 f"(?:\\[(?:{ip_literal}|v{_HEX}+\\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\\]"
                 f"|{_IPV4}|(?:[{unreserved}{_SUB_DELIMS}]|{_PCT})*)(?::[0-9]*)?")
    abempty = f"(?:/{pchar}*)*"
    absolute_path = f"/(?:{pchar}+{abempty})?"
    query = f"(?:\\?(?:{pchar}|[/?{query_extra}])*)?"
    fragment = f"(?:#(?:{pchar}|[/?])*)?"
    uri = (f"[A-Za-z][A-Za-z0-9+\\-.]*:(?://{authority}{abempty}|{absolute_path}"
           f"|{pchar}+{abempty}|){query}{fragment}")
    if absolute:
        return uri
    no_colon = f"(?:[{unreserved}{_SUB_DELIMS}@]|{_PCT})"
    relative = f"(?://{authority}{abempty}|{absolute_path}|{no_colon}+{abempty}|){query}{fragment}"
    return f"{uri}|{relative}"


# rfc3987-syntax takes only the uncompressed IPv6 form (8 groups, or 6 and an IPv4 address)
# in an IRI's host: `[::1]` is refused there, so qrun's IRIs leave the compressed forms out.
_IRI_IPV6 = f"(?:{_H16}:){{6}}{_LS32}"

# RFC 6570 level 4: literals and `{op var,var:3,var*}` expressions (prefixes up to 999: the
# uri-template package refuses 1000); not the operators RFC 6570
# reserves for later (= , ! @ |), which the uri-template package refuses.
_TEMPLATE_LITERAL = f"(?:[!#$&()*+,\\-./0-9:;=?@A-Z\\[\\]_a-z~{_UCSCHAR}{_IPRIVATE}]|{_PCT})"
# Variable names without pct-encoded characters (RFC 6570 allows them; the uri-template
# package's checker refuses "{%00}").
_VARCHAR = "[A-Za-z0-9_]"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,2}}|\\*)?"
_URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"

# RFC 6901: `/` segments, `~` only as `~0` or `~1`.
_JSON_POINTER = "(?:/(?:[^~/]|~[01])*)*"
# draft-handrews-relative-json-pointer-01: a count without leading zeros, then `#` or a JSON
# pointer. jsonschema's checker refuses any digit after a 0 ("100"): left out with it.
_RELATIVE_JSON_POINTER = f"(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})"

# Hostnames (RFC 1123 labels of at most 63 characters; 253 in all, fqdn's limit).
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# IDNA 2008 (the idna package): an ASCII label may not have "--" as its 3rd and 4th
# characters (those are A-labels, "xn--", which idna decodes and checks). Non-ASCII U-labels
# are left out: their rules (contextual, bidi, punycode length) are not worth a regex.
_ALNUM = "[A-Za-z0-9]"
_IDN_LABEL = (f"{_ALNUM}(?:[A-Za-z0-9-]?{_ALNUM})?"                      # 1-3 characters
              f"|{_ALNUM}[A-Za-z0-9-](?:{_ALNUM}|-){_ALNUM}"              # 4
              f"|{_ALNUM}[A-Za-z0-9-](?:{_ALNUM}[A-Za-z0-9-]|-{_ALNUM})"  # 5 to 63
              f"[A-Za-z0-9-]{{0,58}}{_ALNUM}")
_IDN_HOSTNAME = f"(?:{_IDN_LABEL})(?:\\.(?:{_IDN_LABEL}))*"

# RFC 6531: RFC 5321's mailbox with UTF-8 in the local part and the domain. jsonschema's
# checker asks only for an "@"; this keeps llguidance's ASCII email form and adds non-ASCII.
_NON_ASCII = "\u0080-\U0010ffff"
_ATEXT = f"[A-Za-z0-9!#$%&'*+\\-/=?^_`{{|}}~{_NON_ASCII}]"
_ULABEL = f"[A-Za-z0-9{_NON_ASCII}](?:[A-Za-z0-9\\-{_NON_ASCII}]*[A-Za-z0-9{_NON_ASCII}])?"
_IDN_EMAIL = f"{_ATEXT}+(?:\\.{_ATEXT}+)*@(?:{_ULABEL}(?:\\.{_ULABEL})*|\\[{_IPV4}\\])"

# Dates: llguidance's are month-exact but take year 0000 (a valid RFC 3339 year that no
# Python date holds, and the checkers use Python dates), February 29 of every year and the
# leap second :60 (rfc3339-validator refuses it). These patterns are llguidance's
# (parser/src/json/formats.rs of llguidance 1.7.6) without those: one regex builds in less
# time than llguidance's and a narrowing pattern intersected (0.88 against 1.17 ms for a
# date-time, 0.81 against 1.00 for a date).
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"(?:{_YEAR}-(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
         f"|{_YEAR}-(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         f"|{_YEAR}-02-(?:0[1-9]|1[0-9]|2[0-8])|{_LEAP_YEAR}-02-29)")
_TIME = ("(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
         "(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")


def _chars_but(excluded: str) -> str:
    """A class of the printable ASCII characters but `excluded`, tab, and all of non-ASCII.
    Positive, because llguidance 1.7.6 lets a backslash and a double quote through any negated
    class of a JSON Schema pattern (`^[^"]$` takes `"`)."""
    kept = [c for c in map(chr, range(0x20, 0x7F)) if c not in excluded]
    return "[" + "".join("\\" + c if c in "\\]^-[" else c for c in kept) + \
        f"\t{_NON_ASCII}]"


def _regex_format(depth: int) -> str:
    """Regexes (the `regex` format) that Python's `re` compiles (jsonschema's check) and that
    are ECMA 262 too: literals, escapes of punctuation and of \\d \\w \\s \\n..., classes
    with ranges inside one of 0-9, a-z, A-Z, `.`, groups `(...)`, `(?:...)`, `(?=...)`,
    `(?!...)` nested `depth` deep, `^`, `$`, `\\b`, and a quantifier (`*`, `+`, `?`,
    `{n}`, `{n,}`, `{n,m}` where n <= m is plain from the digit counts) after an atom,
    optionally lazy. Left out (each is an error in one of the two, or needs counting):
    backreferences, named groups, inline flags, lookbehind, `{` and `]` as literals."""
    punct = r"\\[!-/:-@\[-`{-~]"
    escape = rf"(?:{punct}|\\[dDwWsSntrfv]|\\x{_HEX}{{2}}|\\u{_HEX}{{4}})"
    ranges = "|".join(f"{c}-[{c}-{last}]" for first, last in (("0", "9"), ("a", "z"), ("A", "Z"))
                      for c in map(chr, range(ord(first), ord(last) + 1)))
    plain = _chars_but("\\[]-&~|")
    item = rf"(?:{plain}|{escape}|\\b|{ranges})"
    klass = rf"\[\^?{item}+-?\]"
    literal = _chars_but(r"\.^$*+?{}[]()|")
    pairs = "|".join(f"{n},[{n}-9]" for n in range(10))
    count = rf"\{{(?:[0-9]{{1,3}},?|{pairs}|[0-9],[1-9][0-9]{{1,2}}|[0-9]{{2}},[1-9][0-9]{{2}})\}}"
    quantifier = rf"(?:[*+?]|{count})\??"
    inner = ""
    for level in range(depth + 1):
        group = rf"|\((?:\?[:=!])?{inner}\)" if level else ""
        atom = rf"(?:{literal}|{escape}|{klass}|\.{group})"
        term = rf"(?:{atom}(?:{quantifier})?|[\^$]|\\[bB])"
        # Terms and `|`s in any order: the language of term*(\|term*)*, with `term` written
        # once per level instead of twice (the text doubled at each level: 31 KB at depth 3,
        # a 14 ms build in llguidance; issue #24 item 4).
        inner = rf"(?:{term}|\|)*"
    return inner


FORMATS: dict[str, Assertion] = {
    "date-time": Assertion(pattern=_full(f"{_DATE}[Tt]{_TIME}")),
    "date": Assertion(pattern=_full(_DATE)),
    "time": Assertion(pattern=_full(_TIME)),
    "duration": Assertion(True),
    "email": Assertion(True),
    "idn-email": Assertion(pattern=_full(_IDN_EMAIL)),
    "hostname": Assertion(True, max_length=253),
    "idn-hostname": Assertion(pattern=_full(_IDN_HOSTNAME), max_length=253),
    "ipv4": Assertion(True),
    "ipv6": Assertion(True),
    "uuid": Assertion(True),
    "uri": Assertion(True),
    "uri-reference": Assertion(pattern=_full(_reference("", _IPV6, absolute=False))),
    "iri": Assertion(pattern=_full(_reference(_UCSCHAR, _IRI_IPV6, True, _IPRIVATE))),
    "iri-reference": Assertion(
        pattern=_full(_reference(_UCSCHAR, _IRI_IPV6, False, _IPRIVATE))),
    "uri-template": Assertion(pattern=_full(_URI_TEMPLATE)),
    "json-pointer": Assertion(pattern=_full(_JSON_POINTER)),
    "relative-json-pointer": Assertion(pattern=_full(_RELATIVE_JSON_POINTER)),
    "regex": Assertion(pattern=_full(_regex_format(3))),
}

# Draft-03's own names and meanings (its section 5.23): `time` is hh:mm:ss with no offset,
# `host-name` and `ip-address` are later drafts' hostname and ipv4 (written
# out: llguidance knows only the later names), `utc-millisec` is a
# number (nothing for strings), `color` a CSS 2.1 color.
_CSS21 = ("aqua|black|blue|fuchsia|gray|green|lime|maroon|navy|olive|orange|purple|red|silver"
          "|teal|white|yellow")
DRAFT3_FORMATS: dict[str, Assertion] = {
    "time": Assertion(pattern=_full("(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]")),
    "host-name": Assertion(pattern=_full(f"{_LABEL}(?:\\.{_LABEL})*"), max_length=253),
    "ip-address": Assertion(pattern=_full(_IPV4)),
    "utc-millisec": Assertion(),
    "color": Assertion(pattern=_full(f"#{_HEX}{{3}}|#{_HEX}{{6}}|{_CSS21}")),
}
