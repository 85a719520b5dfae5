"""Rooms of a readable size (issue 33, item 4): no source file over MAX_FILE_LINES lines, and no function whose body
runs over MAX_FUNCTION_LINES lines unless its docstring gives the reason after "long:".

A function's length is its body's, docstring included, from the first statement to the last line: the signature
does not count (a Typer command declares its options there, one per line). Alembic migrations are left out: a
released migration is history, never edited, and its `upgrade` is the schema of its day written out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpupool"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 60
MIGRATIONS = SRC / "server" / "db" / "migrations" / "versions"


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, body lines) of every function in `source` over MAX_FUNCTION_LINES without a "long:" reason."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.body[0].lineno + 1  # type: ignore[operator]
            if length > MAX_FUNCTION_LINES and "long:" not in (ast.get_docstring(node) or "").lower():
                found.append((node.name, length))
    return found


def sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if MIGRATIONS not in p.parents)


def test_no_source_file_is_over_the_limit() -> None:
    big = {str(p.relative_to(SRC)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not big, f"split these files along their concerns (at most {MAX_FILE_LINES} lines): {big}"


def test_no_function_is_over_the_limit_without_a_reason() -> None:
    long = {f"{p.relative_to(SRC)}:{name}": n for p in sources() for name, n in long_functions(p.read_text())}
    assert not long, (f"split these functions (at most {MAX_FUNCTION_LINES} lines of body), or say why they are "
                      f"long in their docstring after 'long:': {long}")


def _function(lines: int, doc: str = "") -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - (1 if doc else 0)))
    return "def f(\n    a: int,\n    b: int,\n) -> None:\n" + (f'    """{doc}"""\n' if doc else "") + body


@pytest.mark.parametrize(("source", "flagged"), [
    (_function(MAX_FUNCTION_LINES), []),
    (_function(MAX_FUNCTION_LINES + 1), [("f", MAX_FUNCTION_LINES + 1)]),
    (_function(MAX_FUNCTION_LINES + 1, "Does f."), [("f", MAX_FUNCTION_LINES + 1)]),
    (_function(MAX_FUNCTION_LINES + 1, "Does f. Long: one table, read top to bottom."), []),
    ("class C:\n    async def g(self) -> None:\n" + "".join(f"        y{i} = {i}\n" for i in range(70)),
     [("g", 70)]),
])
def test_the_check_catches_a_long_function(source: str, flagged: list[tuple[str, int]]) -> None:
    assert long_functions(source) == flagged
