"""Host functions (docs/language.md §22): Python callables the embedding program registers so
that a template can call them like builtins. A template reaches only what is registered here;
arguments and results are plain data (lang/inputs.py), checked on every call by
runtime/calls.py, which also runs async callables and applies the per-call timeout.

    functions = qrun.Functions()

    @functions.register
    def calc(expression: str) -> float:
        "Evaluate an arithmetic expression."
        ...

    qrun.Query(text, functions=functions).run(...)
"""

from __future__ import annotations

import inspect
import keyword
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, overload

from qrun.errors import UsageError
from qrun.lang.builtins import FUNCTIONS
from qrun.lang.signature import Signature

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RESERVED = frozenset({"run_tool", "tools", "call", "loop", "holes", "gen", "select"})


@dataclass(frozen=True, slots=True)
class HostFunction:
    """One registered callable: its name in templates, its signature as the compiler checks
    it, whether it is a coroutine function, and its description (first docstring paragraph)."""

    name: str
    function: Callable[..., Any]
    signature: Signature
    is_async: bool
    description: str

    def tool(self) -> dict[str, Any]:
        """An OpenAI function-calling tool spec for this function: parameters as a JSON Schema
        from the type hints (str, int, float, bool, list, dict; others unconstrained)."""
        try:
            hints = typing.get_type_hints(self.function)
        except Exception:  # noqa: BLE001 - a hint that does not resolve constrains nothing
            hints = {}
        properties = {name: _schema(hints.get(name)) for name in self.signature.params}
        parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                      "required": list(self.signature.params[
                                          :self.signature.required]),
                                      "additionalProperties": False}
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": parameters}}


class Functions(Mapping[str, HostFunction]):
    """The host functions a template may call, by name. A mapping of names to HostFunction."""

    def __init__(self, functions: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._functions: dict[str, HostFunction] = {}
        for name, function in (functions or {}).items():
            self.register(function, name=name)

    @overload
    def register(self, function: Callable[..., Any], /, *, name: str | None = None
                 ) -> Callable[..., Any]: ...

    @overload
    def register(self, function: None = None, /, *, name: str | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...

    def register(self, function: Callable[..., Any] | None = None, /, *,
                 name: str | None = None) -> Any:
        """Register `function` under `name` (its own name by default); usable as a decorator,
        `@functions.register` or `@functions.register(name="calc")`. Returns the function.

        Raises:
            UsageError: not a callable, a name a template cannot call (not an identifier, a
                builtin's, a keyword, taken), or a signature a template cannot call
                (positional-only or keyword-only parameters without a default).
        """
        if function is None:
            def decorate(inner: Callable[..., Any]) -> Callable[..., Any]:
                return self.register(inner, name=name)
            return decorate
        if not callable(function):
            named = f"'{name}' " if name is not None else ""
            raise UsageError(f"host function {named}must be callable, got "
                             f"{type(function).__name__}")
        chosen = name if name is not None else getattr(function, "__name__", "")
        self._check_name(chosen)
        self._functions[chosen] = HostFunction(
            chosen, function, _signature(chosen, function),
            inspect.iscoroutinefunction(function), _description(function))
        return function

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
            raise UsageError(f"host function name {name!r}: a template can call only names of "
                             "letters, digits and '_' that start with a letter")
        if name in FUNCTIONS or name in _RESERVED or keyword.iskeyword(name):
            raise UsageError(f"host function name '{name}' is a builtin's or reserved: "
                             "register it under another name (register(f, name=...))")
        if name in self._functions:
            raise UsageError(f"host function '{name}' is registered twice")

    @classmethod
    def of(cls, functions: Functions | Mapping[str, Callable[..., Any]] | None) -> Functions:
        """`functions` as a Functions (a dict of name -> callable is registered as is)."""
        if isinstance(functions, Functions):
            return functions
        if functions is not None and not isinstance(functions, Mapping):
            raise UsageError("functions must be a qrun.Functions or a dict of name -> "
                             f"callable, got {type(functions).__name__}")
        return cls(typing.cast("Mapping[str, Callable[..., Any]] | None", functions))

    def signatures(self) -> dict[str, Signature]:
        """Name -> Signature, for the compiler's checks of calls."""
        return {name: f.signature for name, f in self._functions.items()}

    def tools(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI function-calling tool specs of the named functions (all by default), for a
        tool-call hole's tools= or a chat template.

        Raises:
            UsageError: a name that is not registered.
        """
        chosen = list(self._functions) if names is None else names
        missing = [n for n in chosen if n not in self._functions]
        if missing:
            raise UsageError(f"no host function named {', '.join(map(repr, missing))}")
        return [self._functions[n].tool() for n in chosen]

    def __getitem__(self, name: str) -> HostFunction:
        return self._functions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    def __repr__(self) -> str:
        return f"Functions({', '.join(self._functions)})"


def _signature(name: str, function: Callable[..., Any]) -> Signature:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: anything goes
        return Signature((), 0, varargs=True, varkw=True)
    names: list[str] = []
    required = 0
    varargs = varkw = False
    for param in parameters:
        if param.kind is param.VAR_POSITIONAL:
            varargs = True
        elif param.kind is param.VAR_KEYWORD:
            varkw = True
        elif param.kind is param.KEYWORD_ONLY:
            if param.default is param.empty:
                raise UsageError(f"host function '{name}': keyword-only parameter "
                                 f"'{param.name}' needs a default (a template passes "
                                 "arguments by position or by name)")
        else:
            names.append(param.name)
            if param.default is param.empty:
                required += 1
    return Signature(tuple(names), required, varargs, varkw)


def _description(function: Callable[..., Any]) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


_SCHEMAS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, list: {"type": "array"}, dict: {"type": "object"},
}


def _schema(hint: Any) -> dict[str, Any]:
    """A JSON Schema for a parameter's type hint (list[str] and the like by their origin)."""
    if hint in _SCHEMAS:
        return dict(_SCHEMAS[hint])
    origin = typing.get_origin(hint)
    if origin in _SCHEMAS:
        schema = dict(_SCHEMAS[origin])
        args = typing.get_args(hint)
        if origin is list and len(args) == 1:
            schema["items"] = _schema(args[0])
        return schema
    return {}
