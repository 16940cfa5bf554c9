"""What the compiler knows of a function a template may call besides the stdlib (a macro, a
host function registered with qrun.Functions): its parameters, so that a call with the wrong
arguments is a compile error (docs/language.md §13) rather than a failure halfway through a
run. lang knows nothing of the callables themselves (qrun/functions.py holds those)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Signature:
    """`params` in order, the first `required` of them without a default; `varargs` and
    `varkw` when the function takes any number of positional or keyword arguments more."""

    params: tuple[str, ...]
    required: int
    varargs: bool = False
    varkw: bool = False

    def check(self, name: str, positional: int, keywords: tuple[str, ...]) -> str | None:
        """Why a call `name(<positional> args, keywords...)` does not fit, or None."""
        most = len(self.params)
        if positional > most and not self.varargs:
            takes = _count(self.required, most)
            return f"{name}() takes {takes}, got {positional}"
        given = set(self.params[:positional])
        for keyword in keywords:
            if keyword in given:
                return f"{name}() got argument '{keyword}' twice"
            if keyword not in self.params and not self.varkw:
                listed = ", ".join(self.params) or "none"
                return f"{name}() has no argument '{keyword}' (its arguments: {listed})"
            given.add(keyword)
        missing = [p for p in self.params[:self.required] if p not in given]
        if missing:
            return f"{name}() is missing argument{'s' if len(missing) > 1 else ''} " + \
                ", ".join(f"'{m}'" for m in missing)
        return None


def _count(least: int, most: int) -> str:
    word = "argument" if most == 1 else "arguments"
    if least == most:
        return f"{most} {word}"
    return f"{least} to {most} {word}"
