"""A place in a case file, and the error about one (exit 2: the case file is at fault, not the
template or the model)."""

from __future__ import annotations

from dataclasses import dataclass

from qrun.errors import UsageError

__all__ = ["CaseFileError", "Where"]


@dataclass(frozen=True)
class Where:
    """A place in a case file (1-based line and column)."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class CaseFileError(UsageError):
    """A case file that cannot be read as cases, with the place at fault."""

    def __init__(self, message: str, where: Where | None = None) -> None:
        super().__init__(f"{where}: {message}" if where is not None else message)
        self.where = where
