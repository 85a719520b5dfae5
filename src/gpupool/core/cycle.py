"""One scheduling pass: `run_cycle(snapshot, framework, clock=..., rng=...) -> CycleResult`.

The cycle reads one snapshot and returns decisions as data. Actions change a `Workspace` through
`Statement`s so later jobs in the same cycle see earlier placements; at the end the workspace is
restored, so the caller gets its snapshot back unchanged and applies the decisions itself.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.core.clock import Clock
from gpupool.core.decisions import Decision
from gpupool.core.diagnostics import PendingReason
from gpupool.core.framework.runtime import Framework
from gpupool.core.framework.session import Cycle
from gpupool.core.snapshot import ClusterSnapshot


@dataclass(frozen=True, slots=True)
class CycleResult:
    decisions: tuple[Decision, ...]
    #: every job still pending after the cycle, with the last reason an action gave
    pending: Mapping[str, PendingReason]
    #: GPU-unit fair share per queue this cycle (empty without queues)
    fair_shares: Mapping[str, int]
    #: GPU milli left idle on nodes a firm reservation holds for a waiting job (SOR's part above GAR)
    reserved_milli: int = 0


def run_cycle(snapshot: ClusterSnapshot, framework: Framework, *, clock: Clock,
              rng: random.Random) -> CycleResult:
    """Decisions for `snapshot`. Python's cyclic garbage collector is held off until the cycle returns (a full
    collection of a large cluster's objects takes tens of ms and would otherwise land inside some cycles); the
    cycle's garbage is collected after it, outside the decision latency."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        cycle = Cycle(snapshot, framework.plugins, clock, rng)
        try:
            # 1. Run the profile's actions in order, least disruptive first.
            for action in framework.actions:
                action.execute(cycle)
            reserved = _held_idle(cycle)
        finally:
            # 2. Hand the snapshot back exactly as received; the caller applies the decisions.
            cycle.workspace.restore()
        # 3. Decisions out, plus a reason for every job still pending.
        return CycleResult(tuple(cycle.decisions), dict(cycle.pending), dict(cycle.fair_shares), reserved)
    finally:
        if collecting:
            gc.enable()


def _held_idle(cycle: Cycle) -> int:
    """GPU milli still free, after this cycle's placements, on the nodes its firm reservations hold: capacity the
    scheduler keeps from other work for a waiting job (a guessed reservation holds nothing, see `Reservation`)."""
    held = {i for r in cycle.reservations if r.firm for i in r.nodes}
    states = cycle.workspace.table.states
    return sum(states[i].gpu_idle for i in held)
