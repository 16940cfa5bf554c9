"""The `qrun` command: command.py parses arguments and prints results or errors, output.py is
what it shows while it works; the JSON at its edge is qrun/jsonio.py, shared with the server.
`main` is imported when it is asked for, so importing a module of this package (or a server
importing what it shares with it) does not load the whole command line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qrun.cli.command import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from qrun.cli.command import main

        return main
    raise AttributeError(f"module 'qrun.cli' has no attribute {name!r}")
