"""Fairness primitives: exponential usage decay, time-based normalised usage, and Dominant Resource Fairness.

* `decayed` and `normalised_usage` implement the historical-usage term u_q of ALGORITHMS.md §4.5 (and the
  exact decay of §4.2): an amount used Δt ago counts `amount · 2^(−Δt/T½)`.
* `dominant_share` and `drf_allocate` implement weighted DRF with progressive filling (§4.1), comparing
  `s_i / w_i` exactly as `Fraction`s.

All functions are pure. Decayed quantities are floats (they are exponentials); everything compared for a
scheduling decision is exact.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Literal

Number = int | float | Fraction
#: One usage interval: (start_s, end_s, amount held in resource units over [start_s, end_s)).
UsageEvent = tuple[Number, Number, Number]
#: How equal weighted dominant shares are broken: lowest user id first ("id") or highest first ("reverse").
TieRule = Literal["id", "reverse"]


def decayed(amount: float | int, age_s: float, half_life_s: float) -> float:
    """`amount · 2^(−age_s/half_life_s)`; `half_life_s == 0` means no decay.

    Raises ValueError for a negative amount, age or half-life.
    """
    if amount < 0:
        raise ValueError(f"amount must be >= 0, got {amount}")
    if age_s < 0:
        raise ValueError(f"age_s must be >= 0, got {age_s}")
    if half_life_s < 0:
        raise ValueError(f"half_life_s must be >= 0, got {half_life_s}")
    if half_life_s == 0:
        return float(amount)
    return float(amount) * math.exp2(-age_s / half_life_s)


def normalised_usage(usage_events: Iterable[UsageEvent], capacity_per_s: Number, now: Number, window_s: Number,
                     half_life_s: Number = 0) -> Fraction | float:
    """KAI time-based usage u_q = decayed usage of the queue / decayed capacity over the same window (§4.5).

    Each event `(start_s, end_s, amount)` holds `amount` units over `[start_s, end_s)`; it is clipped to the
    window `[now − window_s, now]` and weighted by `2^(−(now − t)/half_life_s)`, integrated exactly. The
    capacity is `capacity_per_s` units held over the whole window. With `half_life_s == 0` (no decay) the
    result is an exact `Fraction` (e.g. 10 GPUs over a 10 h window, 24 GPU·h used ⇒ 6/25); otherwise a float.
    Raises ValueError naming the bad argument or event.
    """
    _check_window(capacity_per_s, window_s, half_life_s)
    start = now - window_s
    used: Fraction | float = Fraction(0) if half_life_s == 0 else 0.0
    for event in usage_events:
        first, last, amount = _checked_event(event)
        low, high = max(first, start), min(last, now)
        if high > low:
            used += _weighted_time(amount, low, high, now, half_life_s)
    capacity = _weighted_time(capacity_per_s, start, now, now, half_life_s)
    return used / capacity


def _check_window(capacity_per_s: Number, window_s: Number, half_life_s: Number) -> None:
    if capacity_per_s <= 0:
        raise ValueError(f"capacity_per_s must be > 0, got {capacity_per_s}")
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    if half_life_s < 0:
        raise ValueError(f"half_life_s must be >= 0, got {half_life_s}")


def _checked_event(event: UsageEvent) -> UsageEvent:
    first, last, amount = event
    if last < first:
        raise ValueError(f"usage event {event!r}: end_s is before start_s")
    if amount < 0:
        raise ValueError(f"usage event {event!r}: amount must be >= 0")
    return first, last, amount


def _weighted_time(amount: Number, low: Number, high: Number, now: Number, half_life_s: Number) -> Fraction | float:
    """`amount · ∫_low^high 2^(−(now − t)/T) dt`; exact `amount · (high − low)` when T is 0.

    Closed form `T/ln 2 · 2^(−(now − high)/T) · (1 − 2^(−(high − low)/T))`, with expm1 for short intervals.
    """
    if half_life_s == 0:
        return Fraction(amount) * (Fraction(high) - Fraction(low))
    rate = math.log(2) / float(half_life_s)
    newest = math.exp(-rate * float(now - high))
    return float(amount) * newest * -math.expm1(-rate * float(high - low)) / rate


def dominant_share(used: Mapping[str, int], capacity: Mapping[str, int]) -> Fraction:
    """`max_r used_r / capacity_r` over resources with positive capacity (0 when there are none).

    A resource with capacity 0 is excluded, and a resource not used has share 0, so it never dominates.
    """
    shares = [Fraction(amount, capacity[name]) for name, amount in used.items() if capacity.get(name, 0) > 0]
    return max(shares, default=Fraction(0))


def drf_allocate(capacity: Mapping[str, int], demands: Mapping[str, Mapping[str, int]],
                 weights: Mapping[str, int] | None = None, tie: TieRule = "id",
                 max_tasks: Mapping[str, int] | None = None) -> dict[str, int]:
    """Weighted DRF progressive filling, work-conserving variant (§4.1); returns user -> tasks placed.

    `demands[user]` is the per-task demand vector; every user has unlimited pending tasks unless
    `max_tasks[user]` bounds them. Repeatedly the user with the smallest `dominant_share / weight` (exact
    `Fraction`; missing weight = 1; ties by `tie`) gets one task if it fits in what is left of `capacity`;
    otherwise it is blocked for good (capacity only shrinks). Stops when no user can place a task.
    Raises ValueError for negative amounts, weights <= 0, an all-zero task or an unknown tie rule.
    """
    _check_drf(capacity, demands, weights, tie)
    order = sorted(demands, reverse=(tie == "reverse"))
    placed = dict.fromkeys(demands, 0)
    free = dict(capacity)
    heap = [(Fraction(0), rank, user) for rank, user in enumerate(order) if _has_tasks(user, placed, max_tasks)]
    while heap:
        _, rank, user = heapq.heappop(heap)
        task = demands[user]
        if any(amount > free.get(name, 0) for name, amount in task.items()):
            continue
        for name, amount in task.items():
            free[name] = free.get(name, 0) - amount
        placed[user] += 1
        if _has_tasks(user, placed, max_tasks):
            used = {name: amount * placed[user] for name, amount in task.items()}
            weight = (weights or {}).get(user, 1)
            heapq.heappush(heap, (dominant_share(used, capacity) / weight, rank, user))
    return placed


def _has_tasks(user: str, placed: Mapping[str, int], max_tasks: Mapping[str, int] | None) -> bool:
    return max_tasks is None or user not in max_tasks or placed[user] < max_tasks[user]


def _check_drf(capacity: Mapping[str, int], demands: Mapping[str, Mapping[str, int]],
               weights: Mapping[str, int] | None, tie: str) -> None:
    if tie not in ("id", "reverse"):
        raise ValueError(f"tie must be 'id' or 'reverse', got {tie!r}")
    if any(amount < 0 for amount in capacity.values()):
        raise ValueError(f"capacity must be non-negative, got {dict(capacity)}")
    for user, task in demands.items():
        if any(amount < 0 for amount in task.values()):
            raise ValueError(f"demands[{user!r}] must be non-negative, got {dict(task)}")
        if not any(task.values()):
            raise ValueError(f"demands[{user!r}]: a task must demand some resource")
    for user, weight in (weights or {}).items():
        if weight <= 0:
            raise ValueError(f"weights[{user!r}] must be > 0, got {weight}")


class DecayingTotal:
    """∫ rate(s)·2^(−(t−s)/T½) ds for a piecewise-constant rate, updated in O(1) per change.

    Call `advance(now, rate)` whenever the rate changes (with the new rate); `value` is the decayed
    total up to the last `advance`. Drivers use one per queue and one for the cluster's capacity to
    get u_q = value_q / value_capacity (§4.5) without keeping usage history.
    """

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self.half_life_s = half_life_s
        self.value = 0.0
        self.rate = 0.0
        self.at: float | None = None

    def advance(self, now: float, rate: float) -> None:
        if self.at is not None:
            elapsed = now - self.at
            if elapsed < 0:
                raise ValueError("DecayingTotal: time went backwards")
            factor = math.exp2(-elapsed / self.half_life_s)
            self.value = self.value * factor + self.rate * self.half_life_s / math.log(2) * (1 - factor)
        self.at = now
        self.rate = rate
