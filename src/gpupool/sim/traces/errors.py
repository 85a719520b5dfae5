"""Trace input errors that say where: file, line and column."""

from __future__ import annotations

#: how much of an offending value an error message quotes
SHOWN_CHARS = 40


class TraceError(ValueError):
    def __init__(self, path: str, line: int, column: str, message: str) -> None:
        self.path, self.line, self.column = path, line, column
        super().__init__(f"{path}:{line}: column {shown(column)}: {message}")


def shown(value: object) -> str:
    """`value` quoted for an error message: control characters escaped, cut to SHOWN_CHARS characters."""
    text = str(value)
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")
