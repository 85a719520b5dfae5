"""Fair-share division of one resource among sibling queues (ALGORITHMS.md §4.4, KAI-Scheduler style).

Each resource (GPU, CPU, memory) is divided on its own, every cycle, in three phases:

1. *deserved*: every queue gets `min(deserved, min(request, limit))`; `deserved == -1` counts as the total.
   When that over-commits the total, the phase-1 shares are kept and phases 2 and 3 are skipped.
2. *water-filling*: priority levels from highest to lowest; within a level, rounds hand out the remainder in
   proportion to `P_q = max(0, w'_q + k·(w'_q − u_q))` (§4.5), whole quanta only, until nobody else wants
   any; the fractional part of each unsatisfied queue's share is remembered.
3. *leftovers*: level by level, at most one quantum per queue with a remembered fraction, by
   (fraction desc, created asc, name asc).

All shares are exact `Fraction`s; results are integers. Leftover that nobody wants stays unassigned.

**[gpupool]** differs from KAI on purpose: a priority level with a single queue also runs the loop (capped at
its request and limit) instead of taking the whole remainder; phase 3 never gives more than a queue still asks
for (with `quantum > 1` a quantum can exceed its remaining request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import groupby

UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """One queue's claim on one resource, in integer resource units (e.g. milli-GPU).

    `request` is the demand (allocated + pending); `deserved` the guaranteed quota (−1 = unlimited, 0 = none);
    `limit` the most it may ever get (−1 = no limit); `weight` its over-quota weight (0 = nothing over quota);
    higher `priority` levels are served first over quota; smaller `created` is older and wins ties;
    `usage` is the normalised historical usage u_q of §4.5 (0 = no history).
    Raises TypeError for non-integer amounts and ValueError naming the field for out-of-range values.
    """

    name: str
    request: int
    deserved: int = 0
    limit: int = UNLIMITED
    weight: int = 1
    priority: int = 0
    created: int = 0
    usage: Fraction = Fraction(0)

    def __post_init__(self) -> None:
        for field in ("request", "deserved", "limit", "weight", "priority", "created"):
            if type(getattr(self, field)) is not int:
                raise TypeError(f"queue {self.name}: {field} must be an int, got {getattr(self, field)!r}")
        for field, low in (("request", 0), ("deserved", UNLIMITED), ("limit", UNLIMITED), ("weight", 0)):
            if getattr(self, field) < low:
                raise ValueError(f"queue {self.name}: {field} must be >= {low}, got {getattr(self, field)}")
        if self.usage < 0:
            raise ValueError(f"queue {self.name}: usage must be >= 0, got {self.usage}")

    @property
    def requestable(self) -> int:
        """min(request, limit): the most this queue can use (limit −1 ⇒ request)."""
        return self.request if self.limit == UNLIMITED else min(self.request, self.limit)


@dataclass(frozen=True, slots=True)
class QueueNode:
    """A queue in a hierarchy. A parent's `request` is the caller's sum of its subtree's demand."""

    request: ShareRequest
    children: tuple[QueueNode, ...] = ()


def divide(total: int, queues: Sequence[ShareRequest], k_value: Fraction = Fraction(1),
           quantum: int = 1) -> dict[str, int]:
    """Divide `total` units of one resource among sibling `queues`; returns name -> fair share.

    `k_value` weighs historical usage (§4.5; values <= 0 mean 0, the classic behaviour). `quantum` is the
    size of a "whole unit" (1000 for whole GPUs counted in milli-GPU). Contracts: every share is at most the
    queue's `requestable`; each gets at least `min(deserved, requestable)`; when those phase-1 amounts fit in
    `total`, the shares sum to at most `total`, otherwise the phase-1 amounts are returned unchanged.
    The result does not depend on the order of `queues`. Raises ValueError naming a bad argument.
    """
    _check_division(total, queues, quantum)
    shares = {q.name: _deserved_share(q, total) for q in queues}
    remaining = total - sum(shares.values())
    if remaining <= 0:
        return shares
    levels = _priority_levels(queues)
    fractions: dict[str, Fraction] = {}
    k = max(Fraction(k_value), Fraction(0))
    for level in levels:
        remaining = _water_fill(level, shares, remaining, k, quantum, fractions)
    _hand_out_leftovers(levels, shares, remaining, quantum, fractions)
    return shares


def divide_tree(total: int, roots: Sequence[QueueNode], k_value: Fraction = Fraction(1),
                quantum: int = 1) -> dict[str, int]:
    """Divide `total` among `roots`, then each node's share among its children, recursively.

    Returns the share of every node of the tree (parents included) by name; names must be unique in the tree.
    """
    shares = divide(total, [node.request for node in roots], k_value, quantum)
    out = dict(shares)
    for node in roots:
        if not node.children:
            continue
        for name, share in divide_tree(shares[node.request.name], node.children, k_value, quantum).items():
            if name in out:
                raise ValueError(f"divide_tree: queue name {name!r} appears twice in the tree")
            out[name] = share
    return out


def _check_division(total: int, queues: Sequence[ShareRequest], quantum: int) -> None:
    if type(total) is not int or total < 0:
        raise ValueError(f"total must be a non-negative int, got {total!r}")
    if type(quantum) is not int or quantum < 1:
        raise ValueError(f"quantum must be an int >= 1, got {quantum!r}")
    names = [q.name for q in queues]
    if len(set(names)) != len(names):
        raise ValueError(f"queue names must be unique, got {sorted(names)}")


def _deserved_share(queue: ShareRequest, total: int) -> int:
    """Phase 1: min(deserved (−1 ⇒ total), requestable)."""
    deserved = total if queue.deserved == UNLIMITED else queue.deserved
    return min(deserved, queue.requestable)


def _priority_levels(queues: Sequence[ShareRequest]) -> list[list[ShareRequest]]:
    """Queues grouped by priority, highest level first; each level in (created, name) order."""
    ordered = sorted(queues, key=lambda q: (-q.priority, q.created, q.name))
    return [list(level) for _, level in groupby(ordered, key=lambda q: q.priority)]


def _water_fill(level: list[ShareRequest], shares: dict[str, int], remaining: int, k: Fraction, quantum: int,
                fractions: dict[str, Fraction]) -> int:
    """Phase 2 for one priority level: rounds until no queue was satisfied below its share; returns remaining.

    Mutates `shares` and `fractions` (the remembered fractional part of each unsatisfied queue's share).
    """
    while remaining > 0:
        unsatisfied = [q for q in level if shares[q.name] < q.requestable]
        weights = _share_weights(unsatisfied, k)
        weight_sum = sum(weights.values(), Fraction(0))
        if weight_sum == 0:
            break
        give, again = remaining, False
        for queue in unsatisfied:
            if remaining <= 0:
                break
            share = give * weights[queue.name] / weight_sum
            granted = _grant(queue, share, shares[queue.name], quantum, fractions)
            again = again or queue.requestable - shares[queue.name] < share
            shares[queue.name] += granted
            remaining -= granted
        if not again:
            break
    return remaining


def _share_weights(unsatisfied: list[ShareRequest], k: Fraction) -> dict[str, Fraction]:
    """P_q = max(0, w'_q + k·(w'_q − u_q)) with w'_q the weight normalised over the unsatisfied queues."""
    total_weight = sum(q.weight for q in unsatisfied)
    if total_weight == 0:
        return {}
    out: dict[str, Fraction] = {}
    for queue in unsatisfied:
        normalised = Fraction(queue.weight, total_weight)
        out[queue.name] = max(Fraction(0), normalised + k * (normalised - Fraction(queue.usage)))
    return out


def _grant(queue: ShareRequest, share: Fraction, current: int, quantum: int, fractions: dict[str, Fraction]) -> int:
    """What one queue gets this round: all it still wants if that fits in `share`, else whole quanta of it.

    A satisfied queue forgets its fraction; otherwise a positive leftover fraction is remembered for phase 3.
    """
    wanted = queue.requestable - current
    if wanted <= share:
        fractions.pop(queue.name, None)
        return wanted
    granted = int(share // quantum) * quantum
    if share - granted > 0:
        fractions[queue.name] = share - granted
    return granted


def _hand_out_leftovers(levels: list[list[ShareRequest]], shares: dict[str, int], remaining: int, quantum: int,
                        fractions: dict[str, Fraction]) -> int:
    """Phase 3: per level, at most one quantum each to queues with a remembered fraction; returns remaining."""
    for level in levels:
        waiting = sorted((q for q in level if q.name in fractions),
                         key=lambda q: (-fractions[q.name], q.created, q.name))
        for queue in waiting:
            if remaining <= 0:
                return remaining
            granted = min(quantum, remaining, queue.requestable - shares[queue.name])
            shares[queue.name] += granted
            remaining -= granted
    return remaining
