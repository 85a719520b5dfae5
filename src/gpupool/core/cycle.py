"""One scheduling pass: `run_cycle(snapshot, framework, clock=..., rng=...) -> CycleResult`.

The cycle reads one snapshot and returns decisions as data. Actions change a `Workspace` through
`Statement`s so later jobs in the same cycle see earlier placements; at the end the workspace is
restored, so the caller gets its snapshot back unchanged and applies the decisions itself.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from gpupool.core.clock import Clock
from gpupool.core.decisions import Decision
from gpupool.core.diagnostics import PendingReason
from gpupool.core.model import JobSpec
from gpupool.core.profile import Framework
from gpupool.core.snapshot import ClusterSnapshot
from gpupool.core.statement import Statement, Workspace


@dataclass(frozen=True, slots=True)
class CycleResult:
    decisions: tuple[Decision, ...]
    #: every job still pending after the cycle, with the last reason an action gave
    pending: Mapping[str, PendingReason]


class Cycle:
    """What actions see: the snapshot, the framework, time, randomness, and the decisions so far."""

    def __init__(self, snapshot: ClusterSnapshot, framework: Framework, clock: Clock,
                 rng: random.Random) -> None:
        self.snapshot = snapshot
        self.framework = framework
        self.now = clock.now()
        self.rng = rng
        self.workspace = Workspace(snapshot)
        self.decisions: list[Decision] = []
        self.pending: dict[str, PendingReason] = {}
        self.started: set[str] = set()

    def statement(self) -> Statement:
        return Statement(self.workspace, self.now)

    def emit(self, job: JobSpec, decisions: list[Decision]) -> None:
        """Record a committed statement's decisions; a job with decisions is no longer pending."""
        self.decisions.extend(decisions)
        self.started.add(job.id)
        self.pending.pop(job.id, None)

    def block(self, job: JobSpec, reason: PendingReason) -> None:
        self.pending[job.id] = reason

    def ordered_pending(self) -> list[JobSpec]:
        """Pending jobs not yet started this cycle, in the queue-order plugin's order."""
        order = self.framework.queue_order.sort_key
        jobs = [j for j in self.snapshot.pending if j.id not in self.started]
        return sorted(jobs, key=lambda j: order(j, self.snapshot))


def run_cycle(snapshot: ClusterSnapshot, framework: Framework, *, clock: Clock,
              rng: random.Random) -> CycleResult:
    cycle = Cycle(snapshot, framework, clock, rng)
    try:
        # 1. Run the profile's actions in order, least disruptive first.
        for action in framework.actions:
            action.execute(cycle)
    finally:
        # 2. Hand the snapshot back exactly as received; the caller applies the decisions.
        cycle.workspace.restore()
    # 3. Decisions out, plus a reason for every job still pending.
    return CycleResult(tuple(cycle.decisions), dict(cycle.pending))
