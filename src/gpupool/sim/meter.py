"""Per-queue meters of a replay: GPU time received against fair share per window, quota checks,
and the time-decayed usage that time-based fair share reads."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from gpupool.core import QueueTree, ResourceVector
from gpupool.core.fairness import DecayingTotal
from gpupool.core.queues import GPU_UNITS
from gpupool.core.quota import admission_after

DAY_S = 86_400.0


@dataclass
class WindowTotals:
    """GPU-unit-seconds per queue in one window, and which queues had pending demand in it."""

    received: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    fair: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    demand: set[str] = field(default_factory=set)


class QueueMeter:
    def __init__(self, tree: QueueTree, start: float, window_s: float = DAY_S, half_life_s: float = DAY_S) -> None:
        self.tree = tree
        self.start = start
        self.window_s = window_s
        self.t = start
        self.used: dict[str, int] = {}
        self.fair: dict[str, int] = {}
        self.waiting: set[str] = set()
        self.windows: dict[int, WindowTotals] = defaultdict(WindowTotals)
        self.violations: dict[str, int] = defaultdict(int)
        self.decayed = {q: DecayingTotal(half_life_s) for q in tree.specs}
        self.capacity = DecayingTotal(half_life_s)

    def advance(self, now: float) -> None:
        """Integrate the current usage and fair shares up to `now`, split at window boundaries."""
        while self.t < now:
            w = int((self.t - self.start) // self.window_s)
            end = min(now, self.start + (w + 1) * self.window_s)
            totals = self.windows[w]
            span = end - self.t
            for queue in self.tree.specs:
                used = self.used.get(queue, 0)
                totals.received[queue] += used * span
                # a queue without pending jobs is due exactly what it uses
                totals.fair[queue] += (self.fair.get(queue, used) if queue in self.waiting else used) * span
            totals.demand |= self.waiting
            self.t = end

    def update(self, now: float, usage: Mapping[str, ResourceVector], fair: Mapping[str, int] | None,
               waiting: set[str], capacity_units: int) -> None:
        """The state from `now` on: usage per queue, this cycle's fair shares, queues with pending jobs."""
        self.advance(now)
        self.used = {q: v[GPU_UNITS] for q, v in usage.items()}
        if fair is not None:
            self.fair = dict(fair)
        self.waiting = {q for w in waiting if w in self.tree.paths for q in self.tree.paths[w]}
        for queue, total in self.decayed.items():
            total.advance(now, self.used.get(queue, 0))
        self.capacity.advance(now, capacity_units)

    def check_quotas(self, usage: Mapping[str, ResourceVector], cluster: ResourceVector) -> None:
        """Count every leaf whose current usage breaks an admission rule (should never happen)."""
        for leaf in self.tree.leaves:
            if leaf in usage and admission_after(self.tree, usage, leaf, cluster):
                self.violations[leaf] += 1

    def history(self) -> dict[str, Fraction]:
        """u_q: each queue's decayed usage over the decayed capacity (0..1)."""
        if self.capacity.value <= 0:
            return {}
        return {q: Fraction(min(1.0, d.value / self.capacity.value)).limit_denominator(10**6)
                for q, d in self.decayed.items()}

    def window_deviations(self) -> list[tuple[int, str, float, float]]:
        """Over full windows, per queue with pending demand and a positive fair share:
        (window, queue, received, fair), in GPU-unit-seconds, by window then queue."""
        complete = sorted(w for w in self.windows if self.start + (w + 1) * self.window_s <= self.t)
        return [(w, queue, self.windows[w].received[queue], self.windows[w].fair[queue])
                for w in complete for queue in sorted(self.windows[w].demand) if self.windows[w].fair[queue] > 0]

    def worst_deviation(self) -> tuple[float, int, str]:
        """Over full windows: (largest |received - fair| / fair among queues with pending demand, window, queue)."""
        return max(((abs(received - fair) / fair, w, queue) for w, queue, received, fair in self.window_deviations()),
                   default=(0.0, -1, ""))
