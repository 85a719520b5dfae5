"""Tables and JSON for the CLI; the only place with colours.

Output is for people: no Python repr reaches a table or a message (a quota is `gpus=1 cpus=2`, a list `A100, H100`),
amounts are in human units (GPU-hours to a sensible precision, never `6.2e-05`; money with its currency), and ids are
never cut: a table shows each id's shortest unique prefix of at least 12 characters (what the dashboard shows and every
command accepts), `--wide` the whole id, `--json` everything as the API gave it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
STATE_STYLE = {"running": "green", "pending": "yellow", "scheduled": "cyan", "failed": "red", "succeeded": "blue",
               "cancelled": "dim", "pending_approval": "magenta", "denied": "red"}
#: an object id of the API (a uuid4 as 32 hex digits)
ID = re.compile(r"[0-9a-f]{32}")
#: the shortest id prefix a table shows (the dashboard's)
SHORT_ID = 12
#: a time as the API gives it (ISO 8601, UTC); a table shows it to the second
TIME = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(Z|\+00:00)")
#: times a table shows as their age, as kubectl's AGE column does (--json keeps the time)
AGES = frozenset({"submitted_at", "last_seen"})
#: cells up to this long (states, queue names, counts) are never broken across lines
SHORT_CELL = 10
#: Python reprs that must never reach a user (tests/conftest.py checks every CLI test's output for them)
REPRS = ("{'", "['", "Value error,")


def error(message: str) -> None:
    """Print an error on one logical line: never wrapped, so a `file:line: column` stays whole to copy."""
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)


def line(text: str) -> None:
    """Print `text` as it is, on one logical line (a token or a command to copy is never wrapped)."""
    console.print(text, soft_wrap=True, highlight=False, markup=False)


def gpu_hours(hours: float | None) -> str:
    """GPU-hours (or any hours) to a precision a person reads: 1234.5, 12.35, 0.0123, "< 0.0001"; never 6.2e-05."""
    if hours is None:
        return ""
    if hours == 0:
        return "0"
    if abs(hours) < 0.0001:
        return "< 0.0001"
    digits = 1 if abs(hours) >= 100 else 2 if abs(hours) >= 1 else 4
    return f"{hours:,.{digits}f}".rstrip("0").rstrip(".")


def money(cents: float | None, currency: str) -> str:
    """An amount of cents as money with its currency: `12.34 USD`."""
    return "" if cents is None else f"{Decimal(str(cents)) / 100:,.2f} {currency}"


def quota(value: dict[str, Any] | None) -> str:
    """A quota (api.Resources as the API shows it) in words: `gpus=1 cpus=2 H100=8`; `none` when it sets nothing."""
    if not value:
        return "none"
    parts = [f"{key}={amount}" for key, amount in value.items() if key != "per_model" and amount is not None]
    parts += [f"{model}={amount}" for model, amount in (value.get("per_model") or {}).items()]
    return " ".join(parts) or "none"


def text(value: Any) -> str:
    """Any API value as table text: no repr of a dict or a list, floats without exponents."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, dict):
        return quota(value) if set(value) <= {"gpus", "cpus", "memory_mib", "per_model"} else " ".join(
            f"{k}={text(v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return ", ".join(text(v) for v in value)
    if isinstance(value, str) and (when := TIME.fullmatch(value)):
        return f"{when[1]} {when[2]}"
    return str(value)


def age(value: Any, now: datetime) -> str:
    """An API time as its age: "45s", "12m", "3h", "2d" (empty when unset; the time itself when unreadable)."""
    if not value:
        return ""
    try:
        then = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return text(value)
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def short_ids(ids: Sequence[str]) -> dict[str, str]:
    """Each id's shortest prefix of at least SHORT_ID characters that no other of `ids` shares, as git abbreviates."""
    out = {}
    for one in ids:
        length = SHORT_ID
        while length < len(one) and any(o != one and o.startswith(one[:length]) for o in ids):
            length += 1
        out[one] = one[:length]
    return out


def show(data: Any, as_json: bool, columns: Sequence[tuple[str, str]] | None = None, title: str = "",
         wide: bool = False) -> None:
    """Print `data` as JSON, or as a table of `columns` (header, key) when it is a list of objects. In a table an id
    shows as its shortest unique prefix (`wide`: whole), in a column that is never narrowed or cut."""
    if as_json or columns is None:
        console.print_json(json.dumps(data, default=str))
        return
    now = datetime.now(UTC)
    cells = [[age(row.get(key), now) if key in AGES else text(row.get(key)) for _, key in columns] for row in data]
    shorter = {} if wide else short_ids(sorted({c for row in cells for c in row if ID.fullmatch(c)}))
    table = Table(title=title or None, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for (header, _), width, whole in zip(columns, *_widths(columns, cells, shorter), strict=True):
        table.add_column(header, no_wrap=whole, min_width=width or None, overflow="fold")
    for row in cells:
        table.add_row(*(_styled(key, shorter.get(cell, cell)) for (_, key), cell in zip(columns, row, strict=True)))
    console.print(table)


def _widths(columns: Sequence[tuple[str, str]], cells: list[list[str]],
            shorter: dict[str, str]) -> tuple[list[int], list[bool]]:
    """Each column's least width and whether it is kept whole: an id column always (never cut); a column of short
    cells (states, names, counts) too, from the left, while the table still fits the terminal, so "pending" never
    reads "pendin g"."""
    ids = [max((len(shorter.get(row[i], row[i])) for row in cells if ID.fullmatch(row[i])), default=0)
           for i in range(len(columns))]
    short = [0 if ids[i] else max([len(header), *(len(row[i]) for row in cells)])
             for i, (header, _) in enumerate(columns)]
    short = [width if width <= SHORT_CELL else 0 for width in short]
    room = console.width - sum(ids) - 3 * len(columns) + 3 - 4 * sum(1 for i in ids if not i)
    for i, width in enumerate(short):  # kept whole from the left while the table still fits the terminal
        if width and width - 4 > room:
            short[i] = 0
        elif width:
            room -= width - 4
    return [i or s for i, s in zip(ids, short, strict=True)], [bool(i or s) for i, s in zip(ids, short, strict=True)]


def _styled(key: str, cell: str) -> str:
    cell = escape(cell)
    return f"[{STATE_STYLE[cell]}]{cell}[/]" if key == "state" and cell in STATE_STYLE else cell
