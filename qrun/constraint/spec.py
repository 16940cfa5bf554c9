"""What a constraint is once lowered, for every part that uses one (the compiler, the runtime,
qrun.Matcher): its spec (the text its engine reads, a description, the type of its values),
the cursor interface every engine's state offers, and the reading of a finished value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

# Named patterns whose values are read as Python values (docs/language.md §15.2).
PATTERN_TYPES = {"INT": "int", "FLOAT": "float", "BOOL": "bool"}


class Cursor(Protocol):
    """A hole's constraint state (regex_index.py MaskCursor, grammar_index.py LlgCursor,
    healing.py HealCursor)."""

    def allowed(self, tokens_left: int) -> npt.NDArray[np.bool_]:
        """Bool mask [V] of tokens that keep a full match reachable within
        `tokens_left` tokens, EOS included where the text so far is a full match."""
        ...

    def can_end(self) -> bool:
        """The text so far is a full match."""
        ...

    def can_continue(self) -> bool:
        """Some non-empty continuation is still possible."""
        ...

    def advance(self, token_id: int) -> None:
        """Consume a token (one that allowed() admitted)."""
        ...

    def copy(self) -> Cursor:
        """An independent cursor in the same state."""
        ...

    def forced_bytes(self) -> bytes:
        """The bytes every continuation must start with (b"" when there is a choice)."""
        ...

    def accepts(self, data: bytes) -> bool:
        """Whether `data`, read from the constraint's start, is a full match."""
        ...


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """A hole's constraint as evaluated for this run: its text for its engine (`engine`
    "dfa": a regex for qrun's DFA; "llguidance": a Lark grammar, a JSON Schema already
    written as one, see qrun/llg), a short description for records and traces, and the type
    its values are read as (docs/language.md §15.2): "json" (parsed JSON), "int", "float",
    "bool" (the INT, FLOAT and BOOL patterns), or "text"."""

    pattern: str
    description: str
    value_type: str = "text"
    engine: str = "dfa"


def typed_value(text: str, value_type: str) -> Any:
    """The value of a hole's text, read as its constraint's type.

    Raises:
        ValueError: the text cannot be read so (the constraint guarantees it can, but Python
            refuses integers of more than 4,300 digits).
    """
    match value_type:
        case "json":
            return json.loads(text)
        case "int":
            return int(text)
        case "float":
            return float(text)
        case "bool":
            return text == "true"
    return text
