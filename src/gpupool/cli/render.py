"""Tables and JSON for the CLI; the only place with colours."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
STATE_STYLE = {"running": "green", "pending": "yellow", "scheduled": "cyan", "failed": "red", "succeeded": "blue",
               "cancelled": "dim", "pending_approval": "magenta", "denied": "red"}


def error(message: str) -> None:
    """Print an error on one logical line: never wrapped, so a `file:line: column` stays whole to copy."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)


def show(data: Any, as_json: bool, columns: Sequence[tuple[str, str]] | None = None, title: str = "") -> None:
    """Print `data` as JSON, or as a table of `columns` (header, key) when it is a list of objects."""
    if as_json or columns is None:
        console.print_json(json.dumps(data, default=str))
        return
    table = Table(title=title or None)
    for header, _ in columns:
        table.add_column(header)
    for row in data:
        cells = []
        for _, key in columns:
            value = row.get(key, "")
            text = "" if value is None else str(value)
            cells.append(f"[{STATE_STYLE[text]}]{text}[/]" if key == "state" and text in STATE_STYLE else text)
        table.add_row(*cells)
    console.print(table)
