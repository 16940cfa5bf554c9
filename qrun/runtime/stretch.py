"""Fixed text as the model reads it (docs/language.md §14.2): the pieces of text the template
renders between two model decisions (its own text, interpolated values, chat markers) are
collected as they come and tokenized as one stretch, so the model reads the tokens the
tokenizer gives the whole text (`Q: ` then `What` reads `[Q, :, ' What']`, not `[Q, :, ' ',
What]`). Only the template's own pieces may spell control tokens: a value's `<|im_end|>` stays
characters."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol


class Encoder(Protocol):
    """What a stretch needs of a backend (backends/base.py Backend)."""

    @property
    def control_tokens(self) -> Mapping[str, int]:
        ...

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        ...


@dataclass(frozen=True, slots=True)
class Run:
    """Ordinary text between two control tokens of a stretch, encoded as one. `seam_at`: the
    character offset of the first value piece inside it (not at its start), where runs of one
    template begin to differ; None when it has none."""

    text: str
    seam_at: int | None = None

    def after(self, skip: int) -> Run:
        """The run without its first `skip` characters."""
        seam = self.seam_at - skip if self.seam_at is not None else None
        return Run(self.text[skip:], seam if seam is not None and seam > 0 else None)

    def before(self, text: str) -> Run:
        """The run with `text` in front."""
        seam = self.seam_at + len(text) if self.seam_at is not None else None
        return Run(text + self.text, seam)


Segment = Run | int
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
    marks the template's own text (may spell control tokens). `size` is their UTF-8 length, an
    upper bound on their token count (every token is at least one byte; a control token's text
    is longer than one)."""

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
        seam: int | None = None

        def close_run() -> None:
            nonlocal length, seam
            if text:
                out.append(Run("".join(text), seam))
            text.clear()
            length, seam = 0, None

        for piece, special in self.pieces:
            if not special:
                if seam is None and length > 0:
                    seam = length
                text.append(piece)
                length += len(piece)
                continue
            start = 0
            for match in pattern.finditer(piece) if pattern is not None else ():
                text.append(piece[start:match.start()])
                length += match.start() - start
                close_run()
                out.append(controls[match.group()])
                start = match.end()
            text.append(piece[start:])
            length += len(piece) - start
        close_run()
        return out


def encode_segments(backend: Encoder, segments: list[Segment]) -> Encoded:
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
        if segment.seam_at is not None:
            # The tokens the run shares with its text before the value: where two runs with
            # other values part (`Q: ` + `What`: [Q, :] of [Q, :, ' What']).
            before = backend.encode(segment.text[: segment.seam_at])
            shared = _common_prefix(before, run_ids)
            if shared:
                seams.add(len(ids) + shared)
        ids.extend(run_ids)
    seams.discard(0)
    seams.discard(len(ids))
    return Encoded(ids, frozenset(seams))


def count_tokens(backend: Encoder, segments: list[Segment]) -> int:
    """How many tokens the segments encode to."""
    return sum(1 if isinstance(s, int) else len(backend.encode(s.text)) for s in segments)


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
