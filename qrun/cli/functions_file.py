"""`qrun FILE --functions FILE.py` (docs/language.md §16.2, §22): the host functions a run may
call come from a Python file the caller names on the command line, and only from there. The
file is the caller's own code, imported as a module: it defines `functions`, a dict of name ->
callable or a qrun.Functions."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

from qrun.errors import QrunError, UsageError
from qrun.functions import Functions


def load_functions(path: str) -> Functions:
    """The `functions` that the Python file at `path` defines.

    Raises:
        UsageError: the file cannot be read or imported, fails when imported, or defines no
            `functions` (or one of the wrong type, or a function a template cannot call).
    """
    if not os.path.isfile(path):
        raise UsageError(f"--functions {path}: no such file")
    name = "qrun_functions_" + "".join(c if c.isalnum() else "_" for c in
                                       os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--functions {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except QrunError as exc:
        raise UsageError(f"--functions {path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the caller's file failing is a usage error
        raise UsageError(f"--functions {path}: importing it failed: "
                         f"{type(exc).__name__}: {exc}") from None
    except SystemExit as exc:  # sys.exit() at import would end qrun silently (issue #38)
        raise UsageError(f"--functions {path}: importing it called sys.exit({exc.code!r}); a "
                         "functions file defines functions, it does not end the program") \
            from None
    functions = getattr(module, "functions", None)
    if functions is None:
        raise UsageError(f"--functions {path} defines no `functions`: give it a dict of "
                         "name -> callable, or a qrun.Functions, named `functions`")
    try:
        return Functions.of(functions)
    except QrunError as exc:
        raise UsageError(f"--functions {path}: {exc}") from None


def load_all_functions(paths: Sequence[str]) -> Functions:
    """The host functions of every `--functions` file, together (`qrun test`, `qrun lsp`).

    Raises:
        UsageError: a file cannot be loaded, or two of them register the same name.
    """
    together = Functions()
    for path in paths:
        for name, function in load_functions(path).items():
            if name in together:
                raise UsageError(f"--functions {path}: '{name}' is registered by an earlier "
                                 "--functions file too")
            together.register(function.function, name=name)
    return together
