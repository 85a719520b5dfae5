"""ClusterCache: the scheduler's live, in-memory view of nodes and running tasks.

Task states, as the cache sees them::

    (pending in DB) --binder commits an allocation--> ASSUMED --release()--> gone
                                                       (agent start/exit changes nothing here)

Only the binder adds tasks (after its database transaction commits), and only `release` removes
them (agent exit, cancel confirmed, node lost). Resources of a task being stopped stay held until
the release, so a preemptor waits for its victim's GPUs ("pipelined") instead of double-booking
them. Every method takes the lock; the scheduler holds it across a cycle.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from gpupool.core import ClusterSnapshot, DeviceShare, JobSpec, NodeSpec, NodeTable, RunningTask, TaskShape
from gpupool.core.queues import QueueTree

log = logging.getLogger(__name__)

#: the ids of jobs, tasks and allocations that are Kubernetes pods (server/kube) start so
POD_PREFIX = "k8s:"
SLOTS_PER_GPU = 10
MILLI_PER_SLOT = 100


@dataclass
class NodeEntry:
    node_id: str
    spec: NodeSpec
    gpu_ids: list[str]
    schedulable: bool = True
    address: str = ""  # where other nodes reach it (gangs' MASTER_ADDR and hostfile)


@dataclass(frozen=True)
class Held:
    allocation_id: str
    task: RunningTask
    slots: tuple[tuple[str, int], ...]


class ClusterCache:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeEntry] = {}
        self._sources: dict[str, list[NodeEntry]] = {}  # who reported the nodes ("agents", "kubernetes") -> them
        self.table = NodeTable([])
        self.held: dict[str, Held] = {}  # allocation id -> what it holds
        self.by_task: dict[str, str] = {}  # task id -> allocation id
        self.used_slots: dict[str, set[int]] = {}
        self.generation = 0
        #: counts set_schedulable calls: a reader of node rows applies them only if none came since it read
        self.schedulable_changes = 0
        #: GPU milli the latest cycle left idle on nodes held for a waiting job (sampled as SOR's part above GAR)
        self.reserved_milli = 0

    def set_nodes(self, entries: list[NodeEntry], source: str = "agents") -> None:
        """Replace the nodes of `source` (join, leave, GPU change; agents' nodes and a cluster backend's are kept
        apart, so each replaces only its own); running tasks keep their resources."""
        with self.lock:
            self._sources[source] = list(entries)
            self.nodes = {e.spec.name: e for group in self._sources.values() for e in group}
            self.table = NodeTable(e.spec for e in self.nodes.values())
            for held in self.held.values():
                try:
                    self._take(held.task)
                except ValueError:  # the node shrank under its tasks (a cluster's node resized): they stay, it is full
                    log.warning("node %s is smaller than the tasks it runs", held.task.node)
            for entry in self.nodes.values():
                self._apply_schedulable(entry)
            self.generation += 1

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        with self.lock:
            self.schedulable_changes += 1
            entry = self.nodes.get(node)
            if entry is not None and entry.schedulable != schedulable:
                entry.schedulable = schedulable
                self._apply_schedulable(entry)

    def follow_rows(self, schedulable: dict[str, bool], read_after: int) -> bool:
        """Take each node as `schedulable` says, read from the database when `schedulable_changes` was
        `read_after`; nothing (False) if a change came since: it may be newer than the read (a cordon committed
        after it), and the next read sees it."""
        with self.lock:
            if self.schedulable_changes != read_after:
                return False
            for node, flag in schedulable.items():
                self.set_schedulable(node, flag)
            return True

    def _apply_schedulable(self, entry: NodeEntry) -> None:
        i = self.table.index[entry.spec.name]
        self.table.set_state(i, self.table.states[i].with_schedulable(entry.schedulable))

    def slots_for(self, node: str, shares: tuple[DeviceShare, ...],
                  claimed: set[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        """Free (gpu id, slot) pairs covering `shares` on `node`, skipping `claimed` ones, and add them to it."""
        entry = self.nodes[node]
        chosen = []
        for share in shares:
            gpu_id = entry.gpu_ids[share.index]
            used = self.used_slots.get(gpu_id, set())
            free = [s for s in range(SLOTS_PER_GPU) if s not in used and (gpu_id, s) not in claimed]
            need = -(-share.milli // MILLI_PER_SLOT)
            if len(free) < need:
                raise ValueError(f"node {node} GPU {share.index} has {len(free)} free slots, needs {need}")
            chosen += [(gpu_id, s) for s in free[:need]]
        claimed.update(chosen)
        return tuple(chosen)

    def assume(self, allocation_id: str, task: RunningTask, slots: tuple[tuple[str, int], ...]) -> None:
        with self.lock:
            self.held[allocation_id] = Held(allocation_id, task, slots)
            self.by_task[task.task_id] = allocation_id
            for gpu_id, slot in slots:
                self.used_slots.setdefault(gpu_id, set()).add(slot)
            if task.node in self.nodes:
                self._take(task)

    def _take(self, task: RunningTask) -> None:
        i = self.table.index.get(task.node)
        if i is not None:
            self.table.set_state(i, self.table.states[i].take(task.shape, task.shares))

    def release(self, allocation_id: str) -> RunningTask | None:
        """Give an allocation's resources back; None if the cache did not hold it (idempotent)."""
        with self.lock:
            held = self.held.pop(allocation_id, None)
            if held is None:
                return None
            self.by_task.pop(held.task.task_id, None)
            for gpu_id, slot in held.slots:
                self.used_slots.get(gpu_id, set()).discard(slot)
            i = self.table.index.get(held.task.node)
            if i is not None:
                self.table.set_state(i, self.table.states[i].give(held.task.shape, held.task.shares))
            return held.task

    def snapshot(self, pending: tuple[JobSpec, ...], now: float, queues: QueueTree | None) -> ClusterSnapshot:
        """Call with the lock held for as long as the snapshot is used."""
        running = {h.task.task_id: h.task for h in self.held.values()}
        return ClusterSnapshot(self.table, pending, running, self.generation, now, (), queues)


def running_task(task_id: str, job: JobSpec, node: str, shape: TaskShape, shares: tuple[DeviceShare, ...],
                 now: float) -> RunningTask:
    estimate = job.estimate_s
    return RunningTask(task_id, job.id, node, shape, shares, job.queue, job.priority, job.preemptible, now,
                       job.checkpointable, None if estimate is None else now + estimate, job.submitted_at)
