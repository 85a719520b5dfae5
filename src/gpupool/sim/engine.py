"""The event engine: a heap keyed by (time, priority, sequence), so equal times run in priority
order and then in the order they were scheduled. `SimClock` reads the engine's virtual time."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any], None]


class Engine:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = 0

    def schedule(self, at: float, priority: int, handler: Handler, payload: Any = None) -> None:
        """Run `handler(payload)` at virtual time `at` (never before `now`); lower priority runs first."""
        if at < self.now:
            raise ValueError(f"cannot schedule at {at} before now ({self.now})")
        heapq.heappush(self._heap, (at, priority, self._seq, handler, payload))
        self._seq += 1

    def run(self, until: float | None = None) -> None:
        """Process events in order until the heap is empty or the next event is after `until`."""
        while self._heap and (until is None or self._heap[0][0] <= until):
            at, _, _, handler, payload = heapq.heappop(self._heap)
            self.now = at
            handler(payload)
        if until is not None:
            self.now = max(self.now, until)

    def __len__(self) -> int:
        return len(self._heap)


class SimClock:
    """Implements `core.Clock` over an engine's virtual time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def now(self) -> float:
        return self.engine.now
