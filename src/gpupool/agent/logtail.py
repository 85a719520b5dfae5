"""Reading a workload's growing log file in chunks that fit a `LogChunk` frame.

Chunks are at most `max_chunk_bytes` (32 KiB) of the file, cut on a UTF-8 character boundary so no character is
split across frames; undecodable bytes become U+FFFD. `offset` is the byte offset in the file, so the control plane
can store chunks idempotently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_CHUNK_BYTES = 32 * 1024


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    end: int
    text: str


def utf8_cut(data: bytes) -> int:
    """The length of the longest prefix of `data` that does not end inside a multi-byte UTF-8 sequence."""
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        if byte >= 0xC0:
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if needed > back else len(data)
        return len(data)
    return len(data)


class LogTailer:
    """Tails one file from `offset`; a missing file reads as empty."""

    def __init__(self, path: Path, offset: int = 0, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> None:
        if max_chunk_bytes < 4:
            raise ValueError("max_chunk_bytes must hold at least one UTF-8 character")
        self.path = path
        self.offset = offset
        self._max = max_chunk_bytes

    def at_eof(self) -> bool:
        """True when nothing is left to read right now."""
        try:
            return self.path.stat().st_size <= self.offset
        except FileNotFoundError:
            return True

    def read(self, budget_bytes: int, *, final: bool = False) -> list[Chunk]:
        """Chunks of the new data, at most `budget_bytes` in all; advances `offset`.

        With `final` (the writer has exited) a trailing incomplete character is sent as U+FFFD instead of being
        held back for a continuation that will never come.
        """
        chunks: list[Chunk] = []
        try:
            with self.path.open("rb") as src:
                while budget_bytes > 0:
                    src.seek(self.offset)
                    data = src.read(min(self._max, budget_bytes))
                    cut = len(data) if final else utf8_cut(data)
                    if cut == 0:
                        break
                    chunks.append(Chunk(self.offset, self.offset + cut, data[:cut].decode("utf-8", "replace")))
                    self.offset += cut
                    budget_bytes -= cut
        except FileNotFoundError:
            pass
        return chunks
