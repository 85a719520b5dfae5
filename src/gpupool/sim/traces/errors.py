"""Trace input errors that say where: file, line and column."""

from __future__ import annotations


class TraceError(ValueError):
    def __init__(self, path: str, line: int, column: str, message: str) -> None:
        self.path, self.line, self.column = path, line, column
        super().__init__(f"{path}:{line}: column {column!r}: {message}")
