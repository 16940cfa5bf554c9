"""The `qrun` command: command.py parses arguments and prints results or errors, output.py is
what it shows while it works, jsonio.py the strict JSON at its edge."""

from __future__ import annotations

from qrun.cli.command import main

__all__ = ["main"]
