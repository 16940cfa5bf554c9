"""A cursor's earlier states, newest first, as nested pairs `(state, the ones before)`: a
copy of a cursor shares them, so forking one stays O(1) however long its hole (the runtime
forks a cursor at every step it drafts or fast-forwards, runtime/generate.py). MaskCursor
(regex_index.py) keeps its DFA states so, HealCursor (healing.py) the healed bytes it had left;
`rolled_back` is the rollback both give (spec.py Cursor.rollback)."""

from __future__ import annotations

from typing import Any, TypeVar

State = TypeVar("State")
Past = tuple[Any, Any] | None
"""`(state, Past)` or None; typed loosely: mypy has no recursive generic aliases here."""


def rolled_back(state: State, past: Past, steps: int) -> tuple[State, Past]:
    """The state `steps` steps back and the past before it.

    Raises:
        ValueError: a negative count, or more steps than were taken.
    """
    if steps < 0:
        raise ValueError(f"cannot roll back {steps} tokens")
    for _ in range(steps):
        if past is None:
            raise ValueError(f"cannot roll back {steps} tokens: fewer were consumed")
        state, past = past
    return state, past
