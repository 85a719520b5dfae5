"""Outgoing agent frames: numbered with one `seq` per boot at send time, kept until the control plane acks them.

Contract:
* `take()` hands out every pending frame with fresh, strictly increasing seqs; reliable frames (task status, logs)
  stay "in flight" until an `Ack` with an equal or higher seq arrives (acks are cumulative within a boot);
* after a lost connection, `requeue()` puts the in-flight frames back in front of the pending ones, in their
  original order, and drops unreliable ones (heartbeats are worthless once stale); they get NEW seqs when taken
  again, because the control plane ignores seqs lower than one it has applied;
* `Hello` is numbered with `next_seq()` and never kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpupool.protocol.agent import Heartbeat, LogChunk, Renew, TaskStatus

OutFrame = Heartbeat | TaskStatus | LogChunk | Renew


@dataclass(slots=True)
class _Entry:
    frame: OutFrame
    reliable: bool


class Outbox:
    """The send queue of one agent boot (see the module contract). Not thread-safe: use it from the event loop."""

    def __init__(self, boot_id: str, on_put: Callable[[], None] | None = None) -> None:
        self._boot_id = boot_id
        self._on_put = on_put
        self._next_seq = 0
        self._pending: deque[_Entry] = deque()
        self._inflight: dict[int, _Entry] = {}
        self._log_chars = 0

    @property
    def boot_id(self) -> str:
        return self._boot_id

    def next_seq(self) -> int:
        """Reserve the next seq (for frames that bypass the queue, such as Hello)."""
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def put(self, frame: OutFrame, *, reliable: bool = True) -> None:
        """Queue `frame` (its seq is replaced when taken)."""
        self._pending.append(_Entry(frame, reliable))
        if isinstance(frame, LogChunk):
            self._log_chars += len(frame.data)
        if self._on_put is not None:
            self._on_put()

    def take(self) -> list[OutFrame]:
        """Every pending frame, numbered, in queue order; reliable ones move in flight."""
        taken: list[OutFrame] = []
        while self._pending:
            entry = self._pending.popleft()
            seq = self.next_seq()
            entry.frame = entry.frame.model_copy(update={"seq": seq})
            if entry.reliable:
                self._inflight[seq] = entry
            elif isinstance(entry.frame, LogChunk):
                self._log_chars -= len(entry.frame.data)
            taken.append(entry.frame)
        return taken

    def ack(self, seq: int) -> list[OutFrame]:
        """Forget the in-flight frames numbered <= `seq`; return them (oldest first)."""
        done = sorted(s for s in self._inflight if s <= seq)
        acked = [self._inflight.pop(s).frame for s in done]
        self._log_chars -= sum(len(frame.data) for frame in acked if isinstance(frame, LogChunk))
        return acked

    def requeue(self) -> None:
        """The connection is gone: in-flight frames go back first, unreliable pending ones are dropped."""
        again = [self._inflight[s] for s in sorted(self._inflight)]
        self._inflight.clear()
        kept = [entry for entry in self._pending if entry.reliable]
        self._log_chars -= sum(
            len(e.frame.data) for e in self._pending if not e.reliable and isinstance(e.frame, LogChunk)
        )
        self._pending = deque([*again, *kept])

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def unacked_log_chars(self) -> int:
        """Characters of log data queued or in flight: the log tailer stops reading while this is over its window."""
        return self._log_chars
