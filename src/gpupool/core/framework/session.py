"""What a cycle's actions see and share: the `Cycle` (snapshot, plugins, time, randomness, quotas, the workspace
and the decisions so far), the `Plugins` they call, and the `Reservation`s the allocate action makes.

`run_cycle` (`gpupool.core.cycle`) builds one `Cycle` per pass and hands it to each action in turn; actions never
see each other, only what earlier ones left here (decisions, pending reasons, reservations).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from gpupool.core.clock import Clock
from gpupool.core.decisions import Decision
from gpupool.core.diagnostics import PendingReason
from gpupool.core.framework.interfaces import QueueOrderPlugin, QueueView, VictimPlugin
from gpupool.core.framework.placement import Placer
from gpupool.core.model import JobSpec
from gpupool.core.queues import GPU_UNITS, QueueTree, model_resource
from gpupool.core.quota import admission_after, admission_reason, fair_shares, headroom, minimal_charge
from gpupool.core.resources import EMPTY, ResourceVector
from gpupool.core.snapshot import ClusterSnapshot
from gpupool.core.statement import Statement, Workspace
from gpupool.core.units import CPU, MEMORY, MILLI

#: jobs whose minimal charge a queue tree remembers before it starts again
CHARGE_MEMO_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Plugins:
    """The plugin instances a cycle's actions call: the queue order, the placement engine and the victim order."""

    queue_order: QueueOrderPlugin
    placer: Placer
    victims: VictimPlugin


@dataclass(frozen=True, slots=True)
class Reservation:
    """Whole nodes held for a blocked job from `start` to `end` (made by the allocate action; evicting actions keep
    off them too).

    `firm`: the start rests only on expected ends still ahead. A start that rests on a guess (a task of unknown
    length, planned to run as long again as it has run, or one past its estimate) moves later every cycle while that
    task runs on, so such a reservation holds no node against work that fits now (allocate); evicting actions still
    keep off it, so no work is thrown away for a start nobody can promise.
    """

    job_id: str
    queue: str
    nodes: frozenset[int]
    start: float
    end: float
    firm: bool = True

    def blocks(self, now: float, estimate_s: float | None) -> bool:
        """Whether a job starting now with this estimate must keep off the reserved nodes."""
        return estimate_s is None or now + estimate_s > self.start

    def blocks_fitting(self, now: float, estimate_s: float | None) -> bool:
        """Whether a job that fits on free resources now must keep off the reserved nodes (only a firm start holds
        them against it)."""
        return self.firm and self.blocks(now, estimate_s)


def cluster_capacity(snapshot: ClusterSnapshot) -> ResourceVector:
    """Schedulable capacity in quota resources (GPU units per model unit, raw milli per model, CPU, memory).

    Cached on the node table per set of unschedulable nodes (a cycle that fences nodes off while it makes room
    leaves the set as it found it).
    """
    table = snapshot.nodes
    key = ("capacity", id(snapshot.queues), frozenset(table.unschedulable))
    cached = table.derived.get(key)
    if isinstance(cached, ResourceVector):
        return cached
    capacity = _capacity(snapshot)
    for old in [k for k in table.derived if isinstance(k, tuple) and k and k[0] == "capacity"]:
        del table.derived[old]
    table.derived[key] = capacity
    return capacity


def _capacity(snapshot: ClusterSnapshot) -> ResourceVector:
    units = snapshot.queues.gpu_units if snapshot.queues else {}
    amounts: dict[str, int] = {}
    for kind, state in zip(snapshot.nodes.kinds, snapshot.nodes.states, strict=True):
        if not state.schedulable:
            continue
        amounts[CPU] = amounts.get(CPU, 0) + kind.cpu_milli
        amounts[MEMORY] = amounts.get(MEMORY, 0) + kind.memory_mib
        if kind.gpu_count:
            amounts[GPU_UNITS] = amounts.get(GPU_UNITS, 0) + kind.gpu_milli * units.get(kind.model, MILLI) // MILLI
            key = model_resource(kind.model)
            amounts[key] = amounts.get(key, 0) + kind.gpu_milli
    return ResourceVector(amounts)


class Cycle:
    """What actions see: the snapshot, the plugins, time, randomness, quotas and the decisions so far."""

    def __init__(self, snapshot: ClusterSnapshot, plugins: Plugins, clock: Clock, rng: random.Random) -> None:
        self.snapshot = snapshot
        self.plugins = plugins
        self.now = clock.now()
        self.rng = rng
        self.workspace = Workspace(snapshot)
        self.decisions: list[Decision] = []
        self.pending: dict[str, PendingReason] = {}
        self.started: set[str] = set()
        self.tree: QueueTree | None = snapshot.queues
        self.capacity = cluster_capacity(snapshot) if self.tree else EMPTY
        self.fair_shares: dict[str, int] = {}
        #: reservations the allocate action made this cycle; evicting actions keep off their nodes too
        self.reservations: list[Reservation] = []
        #: values actions derive from this cycle's inputs, per owner (dropped with the cycle)
        self.memo: dict[object, object] = {}
        self._quota_failures: dict[str, list[tuple[tuple[tuple[str, int], ...], str]]] = {}
        self._quota_passes: dict[tuple[str, tuple[tuple[str, int], ...]], int] = {}
        #: per leaf: its admission headroom when last computed, and `Workspace.growth` then
        self._rooms: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        self._queue_keys: dict[str, tuple[int, tuple[Hashable, ...]]] = {}
        self._sorted_pending: list[JobSpec] | None = None
        if self.tree is not None:
            self.fair_shares = fair_shares(self.tree, self.workspace.usage, snapshot.pending,
                                           self.capacity[GPU_UNITS], snapshot.usage_history)

    def statement(self) -> Statement:
        return Statement(self.workspace, self.now)

    def emit(self, job: JobSpec, decisions: list[Decision]) -> None:
        """Record a committed statement's decisions; a job with decisions is no longer pending."""
        self.decisions.extend(decisions)
        self.started.add(job.id)
        self.pending.pop(job.id, None)

    def block(self, job: JobSpec, reason: PendingReason) -> None:
        self.pending[job.id] = reason

    def quota_precheck(self, job: JobSpec) -> str:
        """Before placing: "" unless the job's queues surely cannot hold it (its cheapest charge breaks a rule).
        The cluster's own capacity is left to placement: a job the cluster has no room for waits for room (and
        may get a reservation) rather than being refused as over quota.

        The rules read only some resources (`QueueTree.checks`), and only those of the charge are compared. Usage
        only grows while allocating, so a charge that failed in a queue fails again for any job of that queue
        asking at least as much; those jobs are refused without another check. A charge that passed passes again
        until usage changes.
        """
        if self.tree is None:
            return ""
        charge, checked = self._charge(job)
        seq = self.workspace.usage_seq
        if self._quota_passes.get((job.queue, checked)) == seq or self._within_room(job, charge):
            self._quota_passes[(job.queue, checked)] = seq
            return ""
        for failed, reason in self._quota_failures.get(job.queue, []):
            if all(charge[r] >= v for r, v in failed):
                return reason
        reason = admission_reason(self.tree, self.workspace.usage, job.queue, charge, None)
        if reason:
            self._quota_failures.setdefault(job.queue, []).append((checked, reason))
        else:
            self._quota_passes[(job.queue, checked)] = seq
            self._rooms[job.queue] = (headroom(self.tree, self.workspace.usage, job.queue, None),
                                      dict(self.workspace.growth))
        return reason

    def _charge(self, job: JobSpec) -> tuple[ResourceVector, tuple[tuple[str, int], ...]]:
        """The job's minimal charge and the part of it the rules read: a function of its tasks and whether it may be
        preempted, kept on the tree per job id (pending jobs come back every cycle) for as long as the job's tasks
        are the same tuple object."""
        assert self.tree is not None
        memo = self.tree.derived.get(minimal_charge)
        if not isinstance(memo, dict) or len(memo) >= CHARGE_MEMO_LIMIT:
            memo = self.tree.derived[minimal_charge] = {}
        found = memo.get(job.id)
        if found is None or found[0] is not job.tasks or found[1] != job.preemptible:
            charge = minimal_charge(job, self.tree)
            found = memo[job.id] = (job.tasks, job.preemptible, charge,
                                    tuple(item for item in charge.items() if self.tree.checks(item[0])))
        return found[2], found[3]

    def _within_room(self, job: JobSpec, charge: ResourceVector) -> bool:
        """Whether `charge` fits the queue's headroom as last computed, less all usage added since (a bound)."""
        entry = self._rooms.get(job.queue)
        if entry is None:
            return False
        room, grown_then = entry
        growth = self.workspace.growth
        return all(charge[r] <= left - growth.get(r, 0) + grown_then.get(r, 0) for r, left in room.items())

    def quota_reason(self, job: JobSpec, before: tuple[int, ResourceVector] | None = None) -> str:
        """After a job's tentative placement: "" if its queues may hold it, else the first rule it breaks.

        `before` is (usage_seq, the leaf's usage) just before the placement: if the quota precheck passed a charge
        equal to the placed one (in the resources the rules read) at that usage, the placement passes too.
        """
        if self.tree is None:
            return ""
        if before is not None:
            prior, tree = before[1], self.tree
            checked = tuple(item for item in self.workspace.usage[job.queue].changes_from(prior)
                            if tree.checks(item[0]))
            if self._quota_passes.get((job.queue, checked)) == before[0]:
                return ""
        return admission_after(self.tree, self.workspace.usage, job.queue, self.capacity)

    def usage_mark(self, queue: str) -> tuple[int, ResourceVector]:
        """(usage_seq, `queue`'s usage) now, for `quota_reason(job, before=...)`."""
        return self.workspace.usage_seq, self.workspace.usage.get(queue, EMPTY)

    def view(self, queue: str) -> QueueView:
        assert self.tree is not None
        spec = self.tree.specs[queue]
        return QueueView(self.workspace.usage.get(queue, EMPTY), self.fair_shares.get(queue, 0),
                         self.capacity, spec.over_quota_weight, spec.priority)

    def pending_order(self) -> Iterator[JobSpec]:
        """Pending jobs not yet started, in queue order; a queue's key is recomputed after each of its jobs."""
        plugin = self.plugins.queue_order
        jobs = [j for j in self._by_job_key() if j.id not in self.started]
        if self.tree is None or plugin.queue_key(jobs[0].queue if jobs else "", self._safe_view()) is None:
            yield from jobs
            return
        by_queue: dict[str, list[JobSpec]] = {}  # each queue's jobs, last first
        for job in reversed(jobs):
            by_queue.setdefault(job.queue, []).append(job)
        heap: list[tuple[tuple[Hashable, ...], str]] = []
        for queue in by_queue:
            heapq.heappush(heap, (self._key(queue), queue))
        while heap:
            key, queue = heapq.heappop(heap)
            left = by_queue[queue]
            while left:
                head = left.pop()
                if head.id not in self.started:
                    yield head
                if left and (fresh := self._key(queue)) != key:
                    heapq.heappush(heap, (fresh, queue))
                    break
                # an unchanged key would be popped again at once (the rest of the heap is as it was): go on here

    def _by_job_key(self) -> list[JobSpec]:
        """The snapshot's pending jobs by the plugin's job key (a function of the job and the cycle's time), sorted
        once for every action of the cycle."""
        if self._sorted_pending is None:
            plugin, now = self.plugins.queue_order, self.now
            self._sorted_pending = sorted(self.snapshot.pending, key=lambda j: plugin.job_key(j, now))
        return self._sorted_pending

    def _key(self, queue: str) -> tuple[Hashable, ...]:
        """The queue's place in the order; a queue's view changes only with usage, so the key is kept until then."""
        if self.tree is None or queue not in self.tree.specs:
            return (True, queue)  # unknown queues last; their jobs are rejected by quota
        seq, key = self._queue_keys.get(queue, (-1, ()))
        if seq != self.workspace.usage_seq:
            key = (False, *(self.plugins.queue_order.queue_key(queue, self.view(queue)) or ()))
            self._queue_keys[queue] = (self.workspace.usage_seq, key)
        return key

    def _safe_view(self) -> QueueView:
        return QueueView(EMPTY, 0, self.capacity, 1, 0)
