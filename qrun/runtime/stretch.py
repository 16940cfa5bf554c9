"""Fixed text as the model reads it (docs/language.md §14.2): the pieces of text the template
renders between two model decisions (its own text, interpolated values, chat markers) are
collected as they come and tokenized as one stretch, so the model reads the tokens the
tokenizer gives the whole text (`Q: ` then `What` reads `[Q, :, ' What']`, not `[Q, :, ' ',
What]`). Only the template's own pieces may spell control tokens: a value's `<|im_end|>` stays
characters. Also how a template text begins as the model reads it (text_head), which the
rule that a hole ends where the model begins the next text needs (runtime/hole.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from qrun.backends.base import Backend

MAX_SEAMS = 8
"""Value pieces per run whose start is looked for among the run's tokens (each costs one more
encode of the run's text before it): enough for the places where runs of one template part."""


@dataclass(frozen=True, slots=True)
class TextRun:
    """Ordinary text between two control tokens of a stretch, encoded as one. `seams`: the
    character offsets inside it (not at its start) where a value piece begins, at most
    MAX_SEAMS of them: where runs of one template begin to differ."""

    text: str
    seams: tuple[int, ...] = ()

    def after(self, skip: int) -> TextRun:
        """The run without its first `skip` characters."""
        return TextRun(self.text[skip:], tuple(s - skip for s in self.seams if s > skip))

    def before(self, text: str) -> TextRun:
        """The run with `text` in front."""
        return TextRun(text + self.text, tuple(s + len(text) for s in self.seams))


Segment = TextRun | int
"""A stretch as the model reads it: runs of ordinary text and control token ids."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A stretch's token ids, and the offsets into them where a chat marker or a value begins
    (prefix cache snapshots are worth keeping there: the runs of one template part there)."""

    ids: list[int]
    seams: frozenset[int]


@dataclass
class Stretch:
    """The pieces collected since the last model decision: (text, special) where `special`
    marks the template's own text (may spell control tokens). `size` is their UTF-8 length;
    twice that bounds their token count (a token has at least one byte, and a SentencePiece
    tokenizer adds at most one `▁` token per run)."""

    pieces: list[tuple[str, bool]] = field(default_factory=list)
    size: int = 0
    counted_at: int = 0  # `size` when the tokens were last counted exactly (Session's limit)

    def __bool__(self) -> bool:
        return bool(self.pieces)

    def add(self, text: str, special: bool) -> None:
        if text:
            self.pieces.append((text, special))
            self.size += len(text.encode("utf-8"))

    def segments(self, controls: Mapping[str, int]) -> list[Segment]:
        """The runs and control tokens of the stretch: control tokens are found in the
        template's own pieces only, and the text between them is one run whatever pieces it
        came from."""
        pattern = _control_pattern(tuple(sorted(controls))) if controls else None
        out: list[Segment] = []
        text: list[str] = []
        length = 0
        seams: list[int] = []

        def close_run() -> None:
            nonlocal length
            joined = "".join(text)
            if joined:
                out.append(TextRun(joined, tuple(seams)))
            text.clear()
            seams.clear()
            length = 0

        for piece, special in self.pieces:
            if not special:
                if length > 0 and len(seams) < MAX_SEAMS:
                    seams.append(length)
                text.append(piece)
                length += len(piece)
                continue
            start = 0
            for match in pattern.finditer(piece) if pattern is not None else ():
                text.append(piece[start:match.start()])
                close_run()
                out.append(controls[match.group()])
                start = match.end()
            text.append(piece[start:])
            length += len(piece) - start
        close_run()
        return out


def encode_segments(backend: Backend, segments: list[Segment]) -> Encoded:
    """Token ids of the segments: each run encoded as ordinary text (no control tokens), each
    control token as itself."""
    ids: list[int] = []
    seams: set[int] = set()
    for segment in segments:
        if isinstance(segment, int):
            seams.update((len(ids), len(ids) + 1))
            ids.append(segment)
            continue
        run_ids = backend.encode(segment.text)
        for seam in segment.seams:
            # The tokens the run shares with its text before the value: where two runs with
            # other values part (`Q: ` + `What`: [Q, :] of [Q, :, ' What']).
            shared = _common_prefix(backend.encode(segment.text[:seam]), run_ids)
            if shared:
                seams.add(len(ids) + shared)
        ids.extend(run_ids)
    seams.discard(0)
    seams.discard(len(ids))
    return Encoded(ids, frozenset(seams))


def count_tokens(backend: Backend, segments: list[Segment]) -> int:
    """How many tokens the segments encode to."""
    return sum(1 if isinstance(s, int) else len(backend.encode(s.text)) for s in segments)


def text_head(backend: Backend, text: str, limit: int) -> tuple[list[int], int | None]:
    """How the template text `text` begins as the model reads it (special tokens recognised):
    its ordinary tokens before its first control token, as many as cover `limit` bytes (the
    last may reach past them), and that control token when it comes within them (else None).
    Only a prefix of the text with room for a whole marker after `limit` bytes is
    tokenized."""
    token_bytes = backend.vocabulary.token_bytes
    head: list[int] = []
    covered = 0
    for token in backend.encode(text[: limit + 256], special=True):
        data = token_bytes[token]
        if data is None:
            return head, token if covered < limit else None
        if covered >= limit:
            break
        head.append(token)
        covered += len(data)
    return head, None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@lru_cache(maxsize=16)
def _control_pattern(texts: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first: at a position where two control texts match, the longer one is the token
    # (as the tokenizers' own leftmost-longest matching of added tokens does).
    ordered = sorted(texts, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered))
