"""The scheduler's view of a Kubernetes cluster, built from the informers' objects each cycle: pure functions.

- nodes: one NodeEntry per Node; CPU and memory are allocatable minus what pods not scheduled by gpupool ask; a
  node takes new pods only when Ready and not cordoned; node constraint tags (constraints.py) say which pending
  pods' selectors, affinities and tolerations it satisfies.
- pending jobs: each unbound gpupool pod is a job of one task, except pods sharing a `gpupool.io/pod-group` label in
  a namespace, which are one gang (all or nothing: `min_tasks` is its `gpupool.io/min-member` less the members
  already bound). A task's id is "k8s:" + the pod's uid (its allocation id in the cache, too).
- a pod gpupool cannot read, or a gang with fewer members than its minimum, waits with its reason.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpupool.core import JobSpec, PendingKind, PendingReason, TaskSpec
from gpupool.server.kube.constraints import allows
from gpupool.server.kube.objects import (
    GROUP_LABEL,
    KubeNode,
    KubePod,
    Malformed,
    estimate_s,
    min_member,
    shape_of,
)
from gpupool.server.scheduler.cache import POD_PREFIX as PREFIX
from gpupool.server.scheduler.cache import NodeEntry


def task_id(pod: KubePod) -> str:
    return PREFIX + pod.uid


def is_pending(pod: KubePod) -> bool:
    return pod.ours and not pod.node and not pod.done and not pod.deleting


def holds(pod: KubePod) -> bool:
    """Whether the pod holds resources on its node: bound and not finished."""
    return bool(pod.node) and not pod.done


@dataclass
class Asks:
    """The distinct constraints of the pending pods, by tag; `needed` is False when no pod has any and no node is
    tainted (then no tag is given at all)."""

    by_tag: dict[str, dict[str, Any]] = field(default_factory=dict)
    needed: bool = False

    @classmethod
    def of(cls, pods: Iterable[KubePod], nodes: Iterable[KubeNode]) -> Asks:
        asks = cls(needed=any(n.taints for n in nodes))
        for pod in pods:
            asks.needed = asks.needed or bool(pod.asks)
            asks.by_tag[pod.tag] = pod.asks
        if not asks.needed:
            asks.by_tag = {}
        return asks

    def tag(self, pod: KubePod) -> tuple[str, ...]:
        return (pod.tag,) if self.needed else ()


def node_entries(nodes: dict[str, KubeNode], pods: Iterable[KubePod], asks: Asks) -> list[NodeEntry]:
    """The cluster's nodes for the cache; `pods` are every pod (those of other schedulers use CPU and memory)."""
    foreign: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for pod in pods:
        if not pod.ours and holds(pod):
            foreign[pod.node][0] += pod.cpu_milli
            foreign[pod.node][1] += pod.memory_mib
    entries = []
    for name in sorted(nodes):
        node = nodes[name]
        cpu, memory = foreign.get(name, (0, 0))
        labels = frozenset(tag for tag, found in asks.by_tag.items() if allows(node, found))
        spec = replace(node.spec, cpu_milli=max(0, node.spec.cpu_milli - cpu),
                       memory_mib=max(0, node.spec.memory_mib - memory), labels=labels)
        entries.append(NodeEntry(PREFIX + name, spec, [g.uuid for g in spec.gpus], node.ready))
    return entries


@dataclass
class Pending:
    """A cycle's pending jobs from pods, the pod of each task, and the reason of each job that cannot be tried."""

    jobs: dict[str, JobSpec] = field(default_factory=dict)
    pods: dict[str, KubePod] = field(default_factory=dict)
    waiting: dict[str, PendingReason] = field(default_factory=dict)
    members: dict[str, list[KubePod]] = field(default_factory=dict)  # job id -> its pending pods


def pending_jobs(pods: Iterable[KubePod], bound: dict[tuple[str, str], int], asks: Asks,
                 queue_of: Callable[[KubePod], str]) -> Pending:
    """Group the pending pods into jobs; `bound` counts the members of each (namespace, group) already bound."""
    groups: dict[str, list[KubePod]] = defaultdict(list)
    for pod in sorted(pods, key=lambda p: (p.created, p.key)):
        group = pod.labels.get(GROUP_LABEL)
        groups[f"{PREFIX}{pod.namespace}/{group}" if group else PREFIX + pod.key].append(pod)
    out = Pending()
    for job_id, members in groups.items():
        out.members[job_id] = members
        try:
            job = _job(job_id, members, bound, asks, queue_of)
        except Malformed as exc:
            out.waiting[job_id] = PendingReason(PendingKind.INVALID_REQUEST, f"{members[0].key}: {exc}")
            continue
        if isinstance(job, PendingReason):
            out.waiting[job_id] = job
            continue
        out.jobs[job_id] = job
        out.pods.update((task_id(p), p) for p in members)
    return out


def _job(job_id: str, members: list[KubePod], bound: dict[tuple[str, str], int], asks: Asks,
         queue_of: Callable[[KubePod], str]) -> JobSpec | PendingReason:
    first = members[0]
    tasks = tuple(TaskSpec(task_id(p), shape_of(p, asks.tag(p))) for p in members)
    estimates = [e for e in (estimate_s(p) for p in members) if e is not None]
    wanted = max(min_member(p) for p in members)
    group = first.labels.get(GROUP_LABEL)
    have = bound.get((first.namespace, group), 0) if group else 0
    if len(members) + have < wanted:
        return PendingReason(PendingKind.GANG_INCOMPLETE, f"pod group {group}: {len(members) + have} of its "
                                                          f"{wanted} members exist (gpupool.io/min-member)")
    deadlines = [p.deadline_s for p in members if p.deadline_s is not None]
    return JobSpec(job_id, tasks, queue_of(first), max(1, min(len(tasks), wanted - have)),
                   max(p.priority for p in members), first.created, runtime_limit_s=min(deadlines, default=None),
                   runtime_estimate_s=max(estimates, default=None), user=first.namespace)
