"""Job logs on the control plane's disk: per attempt, at most a cap of bytes, the tail kept (issue 41, finding 9).

An attempt's log is what its agent ships, each chunk addressed by its byte offset in the workload's own output
(`LogChunk.offset`), so a re-sent chunk lands on the same bytes. It is stored as segments, each a file holding the
log from the offset it starts at: the first is DATA_DIR/logs/<allocation>-<attempt>.log (offset 0, the only file of
a log under half the cap, as before any cap), later ones are <allocation>-<attempt>.log.d/<offset>. When a chunk
would take the newest segment past half the cap, a new segment starts and every segment older than its predecessor
is deleted: a log keeps between half the cap and the cap (plus at most one chunk, for a cap under two chunks), and
no stored byte is ever rewritten to make room.

Reading from an offset that was cut answers a marker line first, saying how many bytes were cut there, then the
oldest bytes kept; the offset to read on from counts log bytes only, never the marker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MARKER = ("[gpupool: {cut} bytes of this log were cut here; the control plane keeps the last {cap} bytes of each "
          "attempt (GPUPOOL_MAX_LOG_BYTES_PER_JOB)]\n")
#: times a reader lists the segments again when one was deleted between listing and opening it
READ_TRIES = 3


@dataclass(frozen=True, order=True)
class Segment:
    start: int
    path: Path


class JobLogs:
    """The logs under `folder`, each capped at `cap_bytes`. One writer (the agent hub); readers at any time."""

    def __init__(self, folder: Path, cap_bytes: int) -> None:
        self.folder, self.cap = folder, cap_bytes

    def _first(self, allocation_id: str, attempt: int) -> Path:
        return self.folder / f"{allocation_id}-{attempt}.log"

    def _more(self, allocation_id: str, attempt: int) -> Path:
        return self.folder / f"{allocation_id}-{attempt}.log.d"

    def segments(self, allocation_id: str, attempt: int) -> list[Segment]:
        """The log's segments, oldest first."""
        first, more = self._first(allocation_id, attempt), self._more(allocation_id, attempt)
        found = [Segment(0, first)] if first.exists() else []
        try:
            names = os.listdir(more)
        except FileNotFoundError:
            names = []
        return found + sorted(Segment(int(name), more / name) for name in names if name.isdigit())

    def append(self, allocation_id: str, attempt: int, offset: int, data: bytes) -> None:
        """Store `data` at log offset `offset`, dropping what followed it (the agent re-sends from there on), unless
        those bytes are stored already. A chunk past the end (one before it is missing) or within a segment that is
        no longer the newest is dropped: the agent re-sends in order, and the newest segment begins where the older
        ones end."""
        segments = self.segments(allocation_id, attempt)
        if not segments:
            if offset == 0:
                self.folder.mkdir(parents=True, exist_ok=True)
                _write_at(self._first(allocation_id, attempt), 0, data)
            return
        last = segments[-1]
        end = last.start + last.path.stat().st_size
        if not last.start <= offset <= end:
            return
        if offset + len(data) <= end and _read_at(last.path, offset - last.start, len(data)) == data:
            return  # a re-sent chunk stored already: cutting and rewriting it would shorten the log for a while
        if offset == last.start or offset - last.start + len(data) <= self.cap // 2:
            _write_at(last.path, offset - last.start, data)
            return
        _write_at(last.path, offset - last.start, b"")  # a re-sent tail moves to the new segment
        new = self._more(allocation_id, attempt) / str(offset)
        new.parent.mkdir(exist_ok=True)
        _write_at(new, 0, data)
        for old in segments[:-1]:
            old.path.unlink(missing_ok=True)

    def read(self, allocation_id: str, attempt: int, offset: int, limit: int) -> tuple[bytes, int]:
        """Up to `limit` log bytes from `offset` (after a marker line if bytes before what is kept were asked
        for), and the offset to read on from."""
        for _ in range(READ_TRIES):
            try:
                return self._read(self.segments(allocation_id, attempt), offset, limit)
            except FileNotFoundError:
                continue  # the writer deleted a segment between our listing and opening it
        return b"", offset

    def _read(self, segments: list[Segment], offset: int, limit: int) -> tuple[bytes, int]:
        if not segments:
            return b"", offset
        marker = b""
        if offset < segments[0].start:
            marker = MARKER.format(cut=segments[0].start - offset, cap=self.cap).encode()
            offset = segments[0].start
        parts: list[bytes] = []
        budget = limit
        for segment in segments:
            if budget <= 0:
                break
            with segment.path.open("rb") as handle:
                if offset >= segment.start + os.fstat(handle.fileno()).st_size:
                    continue
                offset = max(offset, segment.start)
                handle.seek(offset - segment.start)
                part = handle.read(budget)
            parts.append(part)
            offset += len(part)
            budget -= len(part)
        return marker + b"".join(parts), offset


def _read_at(path: Path, position: int, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(position)
        return handle.read(size)


def _write_at(path: Path, position: int, data: bytes) -> None:
    """Write `data` at `position` of the file (made if missing), cutting whatever followed."""
    with open(path, "a+b") as handle:
        handle.truncate(position)
        handle.write(data)
