"""KubeBackend: a Kubernetes cluster as a source of nodes and jobs for the SchedulerLoop.

Each cycle the loop calls, on its thread:
1. `prepare(cache, queues)`: the informers' latest Nodes and Pods become the cache's "kubernetes" nodes, its
   held pods (bound gpupool pods, at the devices their `gpupool.io/gpu-devices` annotation names), and the cycle's
   pending jobs (view.py);
2. `apply(decisions, cycle)`: binds, each assumed in the cache first and then sent as one Binding carrying the
   device annotation (the apiserver sets both at once); evictions go through the Eviction API;
3. `record(reasons, cycle, epoch)`: why each pending pod waits (status.py), and every pod of gpupool's, with that
   reason, offered to the database's records (records.py: written off the bind path, on their own thread).

Pod states, as the cache sees them (kube-scheduler's assume/forget)::

    pending --bind sent--> ASSUMED --watch shows it bound--> HELD --pod done, deleted, or its node gone--> released
                             \\--bind refused (409, 404) or not seen within ASSUME_S--> forgotten (pending again)

The apiserver is the truth: a pod is bound at most once because the Binding subresource refuses a second binding
(409), and a restarted scheduler rebuilds HELD from the bound pods it lists. gpupool's pods bound to a Node that no
longer exists are deleted (as the pod garbage collector does), so that their controllers create them again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpupool.core import Bind, Decision, DeviceShare, Evict, PendingReason, RunningTask, TaskShape
from gpupool.core.decisions import Move
from gpupool.core.fit import fraction_share, lowest_whole_gpus
from gpupool.server.db.repositories import QueueIndex
from gpupool.server.kube.client import KubeClient
from gpupool.server.kube.informer import Informer
from gpupool.server.kube.objects import (
    DEVICES,
    GROUP_LABEL,
    QUEUE_LABEL,
    KubeNode,
    KubePod,
    Malformed,
    devices_of,
    devices_text,
    estimate_s,
    node_of,
    pod_of,
    shape_of,
)
from gpupool.server.kube.records import PodRecorder
from gpupool.server.kube.status import StatusWriter
from gpupool.server.kube.view import PREFIX, Asks, Pending, holds, is_pending, node_entries, pending_jobs, task_id
from gpupool.server.scheduler.cache import ClusterCache

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
#: how long a sent bind is assumed before the watch must have shown it
ASSUME_S = 30.0
#: concurrent binds (and evictions, deletions) sent to the apiserver (more only contend for the interpreter)
WORKERS = 4
#: concurrent why-pending writes
STATUS_WORKERS = 4


@dataclass
class KubeCycle:
    pending: Pending = field(default_factory=Pending)
    #: what the cycle saw (empty before both informers listed), and the name of a pod's queue
    pods: dict[str, KubePod] = field(default_factory=dict)
    nodes: dict[str, KubeNode] = field(default_factory=dict)
    queue_name: Callable[[KubePod], str] | None = None

    @property
    def job_ids(self) -> set[str]:
        return set(self.pending.jobs) | set(self.pending.waiting)


class KubeBackend:
    def __init__(self, client: KubeClient, wake: Callable[[], None], org: str = "default",
                 queues: dict[str, str] | None = None, grace_s: float = 30.0) -> None:
        self.client, self.org, self.queues, self.grace_s = client, org, dict(queues or {}), grace_s
        self.nodes = Informer("nodes", client, node_of, lambda o: o["metadata"]["name"], wake)
        self.pods = Informer("pods", client, pod_of, _pod_key, wake)
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="kube-bind")
        # why-pending writes on their own threads: thousands of waiting pods never hold a bind up
        self.status = StatusWriter(client, ThreadPoolExecutor(STATUS_WORKERS, thread_name_prefix="kube-status"))
        self._assumed: dict[str, float] = {}  # task id -> when the assumption lapses
        self._nodes_seen: object = None
        self._collected: set[str] = set()  # orphaned pods already deleted
        self.binds = 0  # binds the apiserver accepted (tests, metrics)
        #: where gpupool's database records the pods (create_app sets it; None: not recorded)
        self.recorder: PodRecorder | None = None

    def start(self) -> None:
        self.nodes.start()
        self.pods.start()

    def stop(self) -> None:
        self.nodes.stop()
        self.pods.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.status.pool.shutdown(wait=False, cancel_futures=True)
        if self.recorder is not None:
            self.recorder.stop()

    def prepare(self, cache: ClusterCache, queues: QueueIndex) -> KubeCycle:
        """Bring the cache up to date with the cluster; the cycle's pending pods (none before both lists)."""
        if not (self.nodes.synced.is_set() and self.pods.synced.is_set()):
            return KubeCycle()
        _, nodes = self.nodes.snapshot()
        _, pods = self.pods.snapshot()
        waiting = [p for p in pods.values() if is_pending(p) and task_id(p) not in self._assumed]
        asks = Asks.of(waiting, nodes.values())
        entries = node_entries(nodes, pods.values(), asks)
        seen = [(e.spec, e.schedulable) for e in entries]
        queue_of = partial(self._queue, index=queues)
        with cache.lock:
            if seen != self._nodes_seen:
                cache.set_nodes(entries, SOURCE)
                self._nodes_seen = seen
            self._reconcile(cache, nodes, pods, queue_of)
        self._collect(nodes, pods)
        bound = Counter((p.namespace, p.labels[GROUP_LABEL]) for p in pods.values()
                        if p.ours and holds(p) and GROUP_LABEL in p.labels)
        pending = pending_jobs(waiting, dict(bound), asks, queue_of)
        self.status.forget({p.uid for p in waiting})
        return KubeCycle(pending, pods, nodes, partial(self._queue_name, index=queues))

    def _org_id(self, index: QueueIndex) -> str:
        return next((i for i, name in index.orgs.items() if name == self.org), self.org)

    def _queue(self, pod: KubePod, index: QueueIndex) -> str:
        """The core's key of the pod's queue (`_queue_name`)."""
        return index.key(self._org_id(index), self._queue_name(pod, index))

    def _queue_name(self, pod: KubePod, index: QueueIndex) -> str:
        """The name of the pod's queue: its label, else its namespace's queue (config), else the queue named as the
        namespace, else "default"; all in organisation `org`."""
        org_id = self._org_id(index)
        named = pod.labels.get(QUEUE_LABEL) or self.queues.get(pod.namespace)
        if not named and index.find(org_id, pod.namespace) is None and index.find(org_id, "default") is not None:
            return "default"
        return named or pod.namespace

    def _reconcile(self, cache: ClusterCache, nodes: dict[str, KubeNode], pods: dict[str, KubePod],
                   queue_of: Callable[[KubePod], str]) -> None:
        """Held = bound gpupool pods on existing nodes, plus binds sent and not yet seen (until ASSUME_S)."""
        now = time.monotonic()
        live = {task_id(p): p for p in pods.values() if p.ours and holds(p) and p.node in nodes}
        present = {task_id(p): p for p in pods.values()}
        for tid in [t for t in cache.held if t.startswith(PREFIX)]:
            if tid in live:
                self._assumed.pop(tid, None)
                continue
            pod = present.get(tid)
            if tid in self._assumed and pod is not None and is_pending(pod) and self._assumed[tid] > now:
                continue  # sent, not yet seen bound
            self._assumed.pop(tid, None)
            cache.release(tid)
        for tid, pod in live.items():
            if tid not in cache.held:
                self._hold(cache, pod, queue_of(pod))

    def _hold(self, cache: ClusterCache, pod: KubePod, queue: str) -> None:
        """Put a bound pod into the cache at its recorded devices (the lowest free ones if it has none)."""
        i = cache.table.index.get(pod.node)
        if i is None:
            return
        entry = cache.nodes[pod.node]
        shape = _shape(pod)
        state = cache.table.states[i]
        shares = devices_of(pod, len(entry.gpu_ids))
        if shares is None and shape.gpu_count:
            fits = [g for g, free in enumerate(state.gpu_free) if free >= shape.gpu_milli]
            shares = lowest_whole_gpus(state, shape) if not shape.is_shared else (
                fraction_share(shape, fits[0]) if fits else ())
        try:
            slots = cache.slots_for(pod.node, shares or (), set())
            cache.assume(task_id(pod), _running(pod, queue, shape, shares or (), pod.node), slots)
        except ValueError as exc:  # more bound on the node than it has: kept out, and said
            log.warning("kube: pod %s on %s does not fit what gpupool knows of the node: %s", pod.key, pod.node, exc)

    def _collect(self, nodes: dict[str, KubeNode], pods: dict[str, KubePod]) -> None:
        """Delete gpupool's pods bound to nodes that are gone (the pod garbage collector's job), once each."""
        for pod in pods.values():
            if pod.ours and holds(pod) and pod.node not in nodes and pod.uid not in self._collected:
                self._collected.add(pod.uid)
                log.warning("kube: node %s is gone: deleting its pod %s", pod.node, pod.key)
                self.pool.submit(self._call, self.client.delete, pod.namespace, pod.name, pod.uid)

    def apply(self, decisions: Sequence[Decision], cycle: KubeCycle, cache: ClusterCache) -> int:
        """Bind and evict the decisions about pods; the number of pods whose binding the apiserver accepted."""
        binds = [d for d in decisions if isinstance(d, Bind) and d.task_id in cycle.pending.pods]
        victims = [d for d in decisions if isinstance(d, Evict | Move) and d.task_id.startswith(PREFIX)]
        sent = []
        with cache.lock:
            for bind in binds:
                pod = cycle.pending.pods[bind.task_id]
                try:
                    slots = cache.slots_for(bind.node, bind.shares, set())
                except ValueError:
                    continue  # a victim's devices not yet free: next cycle
                job = cycle.pending.jobs[bind.job_id]
                cache.assume(bind.task_id, _running(pod, job.queue, bind.shape, bind.shares, bind.node), slots)
                self._assumed[bind.task_id] = time.monotonic() + ASSUME_S
                sent.append(self.pool.submit(self._bind, cache, pod, bind))
        for victim in victims:
            self._evict(victim.task_id)
        wait(sent)
        return sum(1 for f in sent if f.result())

    def _bind(self, cache: ClusterCache, pod: KubePod, bind: Bind) -> bool:
        try:
            self.client.bind(pod.namespace, pod.name, pod.uid, bind.node, {DEVICES: devices_text(bind.shares)})
        except Exception as exc:  # 409: bound already or another pod now; 404: gone; else the apiserver: forget
            log.info("kube: binding %s to %s refused: %s", pod.key, bind.node, str(exc).splitlines()[0][:200])
            with cache.lock:
                self._assumed.pop(bind.task_id, None)
                cache.release(bind.task_id)
            return False
        self.binds += 1
        return True

    def _evict(self, tid: str) -> None:
        _, pods = self.pods.snapshot()
        pod = next((p for p in pods.values() if task_id(p) == tid), None)
        if pod is not None:
            self.pool.submit(self._call, self.client.evict, pod.namespace, pod.name, int(self.grace_s))

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:
            log.info("kube: %s%s failed: %s", fn.__name__, args[:2], str(exc).splitlines()[0][:200])

    def record(self, reasons: dict[str, PendingReason], cycle: KubeCycle, epoch: int = 0) -> None:
        """Write why each of the cycle's pending pods waits (`reasons`: the core's, by job id), and offer the pods
        with their reasons to the recorder (the database's view; `epoch` fences its write)."""
        every = {**cycle.pending.waiting, **reasons}
        by_pod: dict[str, dict[str, Any]] = {}
        for job_id, reason in every.items():
            members = cycle.pending.members.get(job_id)
            if members:
                self.status.record(members, reason)
                said = reason.to_dict()
                by_pod.update((p.uid, said) for p in members)
        if self.recorder is not None and cycle.queue_name is not None:
            self.recorder.offer(cycle.pods, cycle.nodes, by_pod, cycle.queue_name, epoch)


def _pod_key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def job_id_of(pod: KubePod) -> str:
    group = pod.labels.get(GROUP_LABEL)
    return f"{PREFIX}{pod.namespace}/{group}" if group else PREFIX + pod.key


def _shape(pod: KubePod) -> TaskShape:
    """A bound pod's shape; one gpupool could not read holds its CPU and memory only."""
    try:
        return shape_of(pod)
    except Malformed:
        return TaskShape(pod.cpu_milli, pod.memory_mib)


def _running(pod: KubePod, queue: str, shape: TaskShape, shares: tuple[DeviceShare, ...], node: str) -> RunningTask:
    started = pod.created
    try:
        estimate = estimate_s(pod)
    except Malformed:
        estimate = None
    estimate = estimate if estimate is not None else pod.deadline_s
    return RunningTask(task_id(pod), job_id_of(pod), node, shape, shares, queue, pod.priority, True, started,
                       False, None if estimate is None else started + estimate, pod.created)
