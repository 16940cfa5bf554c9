"""Named regex constraints (`regex=DATE` in a template, and the JSON Schema formats). Each is
`regex` package syntax matched in full with ASCII classes (regex/dfa.py) and compiles to a
small byte DFA; tests/constraint/test_patterns.py pins what each accepts and rejects."""

from __future__ import annotations

__all__ = ["PATTERNS"]

# Building blocks, kept private so each public pattern reads as one line of spec.
# Years 0001-9999 (year 0000 is valid RFC 3339 but not a Python date, which JSON Schema
# validators use); leap years: divisible by 4, centuries only when divisible by 400.
_YEAR = r"([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
_LEAP_YEAR = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"({_YEAR}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
    rf"|{_YEAR}-(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|{_YEAR}-02-(0[1-9]|1[0-9]|2[0-8])"
    rf"|{_LEAP_YEAR}-02-29)"
)
_HOUR = r"([01][0-9]|2[0-3])"
_MINUTE = r"[0-5][0-9]"
_FRACTION = r"(\.[0-9]{1,9})?"
_OFFSET = rf"(Z|[+-]{_HOUR}:{_MINUTE})"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_PCHAR = r"([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_HEX = r"[0-9a-fA-F]"
_NXX = r"[2-9][0-9]{2}"

PATTERNS: dict[str, str] = {
    # JSON / Python integer literal: optional '-', no leading zeros. Excludes '+', '007',
    # digit separators ('1_000', '1,000'), exponents.
    "INT": r"-?(0|[1-9][0-9]*)",
    # JSON number (RFC 8259 §6): int part, optional fraction, optional exponent. Excludes
    # '.5', '5.', '+1', NaN/Infinity, hex.
    "FLOAT": r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    # JSON literals only. Excludes True/False, yes/no, 0/1.
    "BOOL": r"(true|false)",
    # ISO 8601 calendar date, extended format YYYY-MM-DD (RFC 3339 full-date), calendar-exact:
    # month lengths and Gregorian leap years (2024-02-29 yes, 1900-02-29 no). Excludes year
    # 0000, basic format (20240131), week/ordinal dates, signed or 5+ digit years.
    "DATE": _DATE,
    # ISO 8601 local time, extended format: hh:mm or hh:mm:ss with an optional fraction of
    # up to 9 digits. Excludes 24:00, leap second :60, offsets/Z (see DATETIME), 12-hour clock.
    "TIME": rf"{_HOUR}:{_MINUTE}(:{_MINUTE}{_FRACTION})?",
    # RFC 3339 date-time: DATE 'T' hh:mm:ss[.frac] and a required offset (Z or ±hh:mm).
    # Excludes lowercase 't'/'z', a space instead of 'T', leap seconds, missing offsets.
    "DATETIME": rf"{_DATE}T{_HOUR}:{_MINUTE}:{_MINUTE}{_FRACTION}{_OFFSET}",
    # RFC 5322 addr-spec, dot-atom subset: dot-atom local part '@' a domain of two or more
    # LDH labels (RFC 1035) ending in an alphabetic TLD. Excludes quoted local parts,
    # IP-literal domains, comments, non-ASCII (RFC 6531) addresses, length limits (64/255).
    "EMAIL": rf"{_ATEXT}+(\.{_ATEXT}+)*@({_LABEL}\.)+[A-Za-z]{{2,}}",
    # RFC 3986 URI with scheme http or https: host (LDH domain or dotted IPv4), optional
    # port, path, query and fragment of pchar / pct-encoded characters. Excludes userinfo,
    # IPv6 literals, other schemes, non-ASCII IRIs, spaces.
    "URL": (
        rf"https?://({_LABEL}(\.{_LABEL})*|{_OCTET}(\.{_OCTET}){{3}})(:[0-9]{{1,5}})?"
        rf"(/{_PCHAR}*)*(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?"
    ),
    # RFC 9562 UUID string form 8-4-4-4-12 hex digits, either case, any version/variant.
    # Excludes braces, the 'urn:uuid:' prefix, the 32-digit form without hyphens.
    "UUID": rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    # North American Numbering Plan number (area code and exchange start with 2-9), optional
    # '+1 ' prefix, written (NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX, NXX NXX XXXX or
    # 10 digits. Excludes extensions, mixed separators, 7-digit local numbers, '1-' prefix.
    "PHONE_US": (
        rf"(\+1 )?(\({_NXX}\) {_NXX}-[0-9]{{4}}|{_NXX}-{_NXX}-[0-9]{{4}}"
        rf"|{_NXX}\.{_NXX}\.[0-9]{{4}}|{_NXX} {_NXX} [0-9]{{4}}|{_NXX}{_NXX}[0-9]{{4}})"
    ),
    # One ASCII word: letters, optionally joined by single hyphens or apostrophes
    # ("well-known", "don't"). Excludes digits, underscores, non-ASCII letters, spaces,
    # leading/trailing punctuation.
    "WORD": r"[A-Za-z]+(['-][A-Za-z]+)*",
    # One non-empty line: any characters (any script, emoji) except CR and LF. Excludes the
    # empty line and the line terminator itself.
    "LINE": r"[^\r\n]+",
}
