"""Run options: one dataclass for how a run samples (temperature, top_p, top_k, seed,
max_tokens), validated once where it is built, and the table of checks that the compiler (hole
arguments and front matter), the executor (hole arguments computed at run time) and the public
boundary (`Query.run`, `run_many`, the CLI) all use, so an option means the same everywhere."""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from qrun.errors import UsageError
from qrun.limits import Limits

DEFAULT_MAX_TOKENS = 128


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _positive(value: Any) -> str | None:
    return None if is_int(value) and value >= 1 else "a positive integer"


def _count(value: Any) -> str | None:
    return None if is_int(value) and value >= 0 else "an integer >= 0"


def _temperature(value: Any) -> str | None:
    return None if is_number(value) and value >= 0 else "a number >= 0"


def _top_p(value: Any) -> str | None:
    return None if is_number(value) and 0 < value <= 1 else "a number in (0, 1]"


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


CHECKS: Mapping[str, Callable[[Any], str | None]] = {
    "temperature": _temperature,
    "top_p": _top_p,
    "top_k": _count,
    "seed": _count,
    "max_tokens": _positive,
    "trace": _flag,
    "speculate": _flag,
    "limits": lambda v: None if isinstance(v, Limits) else "a qrun.Limits",
}
"""Per option: a check returning what the value must be (for the error message), or None when
the value is fine. Hole arguments of the same names are checked with the same functions."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run samples. None means "not given": the template's front matter applies, then
    the built-in default (temperature 0, i.e. greedy; top_p 1 and top_k 0, i.e. no filter; a
    fresh random seed, reported in the run's stats so the run can be replayed; max_tokens 128
    per hole). A hole's own arguments override these for that hole. `trace` keeps, for every
    sampled token, the mask size and the likeliest alternatives in the run's trace
    (`Result.trace()`; the tokens themselves are always recorded). `limits` bounds the work
    of evaluating the template (qrun.Limits: steps, output characters, integer size).

    Raises (on construction):
        UsageError: a value of the wrong type or out of range, naming the option.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    trace: bool | None = None
    limits: Limits | None = None
    speculate: bool | None = None

    def __post_init__(self) -> None:
        for name, check in CHECKS.items():
            value = getattr(self, name)
            wanted = None if value is None else check(value)
            if wanted is not None:
                raise UsageError(f"{name} must be {wanted}, got {value!r}")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if is_int(value):  # one type per field: 1 -> 1.0
                object.__setattr__(self, name, float(value))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def split(cls, values: Mapping[str, Any]) -> tuple[RunOptions, dict[str, Any]]:
        """Keyword arguments of `Query.run`: those named like an option become the options (each
        validated), the others are returned as they are (the run's inputs)."""
        names = set(cls.names())
        options = cls(**{k: v for k, v in values.items() if k in names})
        return options, {k: v for k, v in values.items() if k not in names}

    def over(self, defaults: RunOptions) -> RunOptions:
        """These options, with those not given here taken from `defaults`."""
        given = {name: getattr(self, name) for name in self.names()
                 if getattr(self, name) is not None}
        return replace(defaults, **given)

    def for_item(self, index: int) -> RunOptions:
        """The options of item `index` of a batch: with a seed S, a seed derived from S and
        the index (the same whatever the batch size); without one, unchanged (each run then
        draws its own)."""
        if self.seed is None:
            return self
        digest = hashlib.blake2b(f"qrun-seed:{self.seed}:{index}".encode(), digest_size=8)
        return replace(self, seed=int.from_bytes(digest.digest(), "little") >> 1)

    def resolved(self) -> Resolved:
        """Every option with a value: the built-in defaults where none was given, and a fresh
        random seed when none was."""
        return Resolved(
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=secrets.randbits(63) if self.seed is None else self.seed,
            max_tokens=DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens,
            trace=bool(self.trace),
            limits=self.limits or Limits(),
            speculate=self.speculate is not False,
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    """RunOptions with every value filled in: what a run actually uses."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    trace: bool
    limits: Limits
    speculate: bool
