"""Stage 0: template bytes or str -> the text the parser sees. Files must be UTF-8 (a UTF-16 or
UTF-32 file is refused, naming its encoding); a leading byte order mark is dropped; newlines
are normalized as Jinja does; and text that cannot be encoded as UTF-8 (a lone surrogate) is
a positioned error here, at compile time, rather than a failure of every run."""

from __future__ import annotations

import codecs
import re

from qrun.errors import TemplateSyntaxError, UsageError
from qrun.source import Source

_NEWLINE = re.compile(r"\r\n?")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOMS = (
    # UTF-32 first: its little-endian mark starts with UTF-16's.
    (codecs.BOM_UTF32_LE, "UTF-32 (little-endian)"),
    (codecs.BOM_UTF32_BE, "UTF-32 (big-endian)"),
    (codecs.BOM_UTF16_LE, "UTF-16 (little-endian)"),
    (codecs.BOM_UTF16_BE, "UTF-16 (big-endian)"),
)
_SAVE_AS_UTF8 = "qrun reads templates as UTF-8: save the file as UTF-8"


def decode_template(data: bytes, name: str) -> str:
    """The text of a template file's bytes, with a UTF-8 byte order mark dropped.

    Raises:
        UsageError: the bytes are UTF-16 or UTF-32 (with a byte order mark, or ASCII-range
            UTF-16 without one), or not UTF-8; the message names the encoding or the offending
            byte's line.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise UsageError(f"cannot read template {name}: it is {encoding} text (it starts "
                             f"with a {encoding[:6]} byte order mark); {_SAVE_AS_UTF8}")
    guess = _utf16_without_bom(data)
    if guess is not None:
        raise UsageError(f"cannot read template {name}: it looks like {guess} text without a "
                         f"byte order mark (every other byte is zero); {_SAVE_AS_UTF8}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UsageError(f"cannot read template {name}: byte 0x{data[err.start]:02x} on line "
                         f"{line} is not valid UTF-8; {_SAVE_AS_UTF8}") from None
    return text.removeprefix("\ufeff")


def _utf16_without_bom(data: bytes) -> str | None:
    """UTF-16 of mostly ASCII-range text has a zero in every other byte; UTF-8 text has (next
    to) none. Looks at the first 4 KiB."""
    sample = data[:4096]
    pairs = len(sample) // 2
    if pairs == 0:
        return None
    zero_even = sample[0:pairs * 2:2].count(0)
    zero_odd = sample[1:pairs * 2:2].count(0)
    if zero_odd * 2 >= pairs and zero_even * 8 <= zero_odd:
        return "UTF-16 (little-endian)"
    if zero_even * 2 >= pairs and zero_odd * 8 <= zero_even:
        return "UTF-16 (big-endian)"
    return None


def normalize_text(text: str) -> str:
    """The text the parser reads: a leading byte order mark dropped (editors hide it, and it
    would turn front matter into prompt text), and every newline ("\\r\\n", a lone "\\r" or
    "\\n") written "\\n", as Jinja's lexer does (`newline_re`, with its default
    `newline_sequence`). Line numbers are unchanged (all three end a line in an editor), so
    positions in the normalized text agree with the file."""
    return _NEWLINE.sub("\n", text.removeprefix("\ufeff"))


def check_encodable(source: Source) -> TemplateSyntaxError | None:
    """The error for the first lone surrogate in the text (U+D800-U+DFFF: a Python str can
    hold one, UTF-8 cannot encode it, so no tokenizer could read the template), or None."""
    match = _SURROGATE.search(source.text)
    if match is None:
        return None
    return TemplateSyntaxError(
        f"the template contains a lone surrogate U+{ord(match.group(0)):04X}, which is not "
        "valid Unicode text", source.span_at(match.start(), 1), source,
        ["surrogates exist only in pairs inside UTF-16; write the character itself"])


def surrogate_in(value: str) -> str | None:
    """The first lone surrogate of `value` as 'U+D800', or None when it encodes as UTF-8."""
    match = _SURROGATE.search(value)
    return None if match is None else f"U+{ord(match.group(0)):04X}"
