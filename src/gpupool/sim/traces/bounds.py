"""What the simulator accepts from a file, and reading CSV within it.

Trace, workload and queue files come from anywhere (a download, a colleague, a generator), so the readers bound
every value before they build anything from it: a node of a billion GPUs, a 4,000-digit count, a deletion time of
1e30 seconds or a 200 kB field ends the run with one line, `file:line: column 'x': what is wrong`, instead of
gigabytes of memory, a simulation that never ends or a traceback. The bounds sit far above real clusters and traces
(openb: 1,523 nodes of at most 8 GPUs, 8,152 pods over 150 days, files under 1 MB).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from gpupool.sim.traces.errors import TraceError, shown

MAX_FILE_BYTES = 32 << 20
MAX_LINE_BYTES = 16 << 10
MAX_COLUMNS = 64
MAX_FIELD_CHARS = 256
MAX_NODES = 20_000
MAX_PODS = 200_000
MAX_GPUS_PER_NODE = 64
MAX_CPU_MILLI = 10_000_000  # 10,000 cores
MAX_MEMORY_MIB = 1 << 26  # 64 TiB
MAX_TIME_S = 10 * 365 * 86_400  # ten years of trace clock
MAX_GANG = 1024
MAX_TASKS = 500_000  # in one pod list, gangs counted task by task
MAX_NAME_CHARS = 64

_WHOLE = re.compile(r"[+-]?[0-9]+")
_DIGITS = 19  # int64
_NAME = re.compile(rf"[A-Za-z0-9][^\x00-\x1f\x7f]{{0,{MAX_NAME_CHARS - 1}}}")


def whole(low: int, high: int) -> Callable[[str], int]:
    """A parser of whole numbers in [low, high] written in ASCII digits; its ValueError says what is wrong. The
    number of digits is checked before any conversion, so a 4,000-digit value costs nothing."""
    def parse(text: str) -> int:
        text = text.strip()
        if not _WHOLE.fullmatch(text):
            raise ValueError(f"{shown(text)} is not a whole number")
        value = int(text) if len(text.lstrip("+-")) <= _DIGITS else (high + 1 if text[0] != "-" else low - 1)
        if value < low:
            raise ValueError(f"{shown(text)} is below the minimum {low}")
        if value > high:
            raise ValueError(f"{shown(text)} is above the maximum {high}")
        return value
    return parse


def name(text: str) -> str:
    """A GPU model or queue name: starts with a letter or digit (never a character a spreadsheet reads as a
    formula), no control characters, at most MAX_NAME_CHARS characters."""
    if not _NAME.fullmatch(text):
        raise ValueError(f"{shown(text)}: a name starts with a letter or digit and has at most {MAX_NAME_CHARS} "
                         "characters, none of them control characters")
    return text


def check_size(path: Path, limit: int) -> None:
    """TraceError unless the file at `path` has at most `limit` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise TraceError(str(path), 1, "-", f"the file has {size} bytes; at most {limit} are read")


def _lines(path: str, handle: BinaryIO) -> Iterator[str]:
    """The file's lines, decoded; TraceError for a line over MAX_LINE_BYTES (read no further) or not UTF-8."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(path, number, "-", f"the line is longer than {MAX_LINE_BYTES} bytes")
        try:
            yield raw.decode()
        except UnicodeDecodeError as exc:
            raise TraceError(path, number, "-", f"byte {exc.start + 1} of the line is not UTF-8") from None


def _line_count(handle: BinaryIO) -> int:
    """The lines of the file (a last one without a newline counts); leaves `handle` at the start."""
    count, last = 0, b"\n"
    while block := handle.read(1 << 20):
        count += block.count(b"\n")
        last = block[-1:]
    handle.seek(0)
    return count + (last != b"\n")


def csv_rows(path: Path, required: tuple[str, ...], max_rows: int) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, {column: value}) for each row of a CSV file with a header naming at least `required`, every field at
    most MAX_FIELD_CHARS characters, at most `max_rows` lines after the header. `line` is the 1-based line a row
    ends on."""
    check_size(path, MAX_FILE_BYTES)
    where = str(path)
    with path.open("rb") as handle:
        if _line_count(handle) > max_rows + 1:  # counted first: a row never has fewer lines than one
            raise TraceError(where, max_rows + 2, "-", f"more than {max_rows} rows")
        reader = csv.reader(_lines(where, handle))
        try:
            header = _header(where, next(reader, None), required)
            for row in reader:
                line = reader.line_num
                if len(row) != len(header):
                    raise TraceError(where, line, "-", f"expected {len(header)} fields, found {len(row)}")
                for column, value in zip(header, row, strict=True):
                    if len(value) > MAX_FIELD_CHARS:
                        raise TraceError(where, line, column, f"{len(value)} characters; at most {MAX_FIELD_CHARS}")
                yield line, dict(zip(header, row, strict=True))
        except csv.Error as exc:
            raise TraceError(where, reader.line_num, "-", f"not valid CSV: {exc}") from None


def _header(path: str, header: list[str] | None, required: tuple[str, ...]) -> list[str]:
    if header is None:
        raise TraceError(path, 1, "-", "file is empty")
    if len(header) > MAX_COLUMNS:
        raise TraceError(path, 1, "-", f"{len(header)} columns; at most {MAX_COLUMNS}")
    for column in header:
        if len(column) > MAX_FIELD_CHARS:
            raise TraceError(path, 1, column, f"{len(column)} characters; at most {MAX_FIELD_CHARS}")
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(path, 1, missing[0], f"required column missing (header: {shown(','.join(header))})")
    return header
