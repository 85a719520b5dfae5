"""Kubernetes objects (as the apiserver's JSON: dicts) to what the scheduler needs: pure functions, no I/O.

The annotation contract (docs/operating/kubernetes.md):
- `resources.limits["nvidia.com/gpu"]`: whole GPUs; the annotation `gpupool.io/gpu` ("0.3": 10 % steps) asks a
  fraction of one GPU instead (or whole GPUs: "2").
- label `gpupool.io/queue` (default: the namespace's queue), label `gpupool.io/pod-group` with annotation
  `gpupool.io/min-member` (a gang), annotation `gpupool.io/runtime-estimate` (seconds, or "90s", "30m", "2h").
- gpupool writes `gpupool.io/gpu-devices` before binding: "INDEX:MILLI" per device, comma-separated ("0:500").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from gpupool.core import DeviceShare, GpuDevice, NodeSpec, TaskShape
from gpupool.protocol.api import gpus_to_milli
from gpupool.server.kube.constraints import constraints, signature

SCHEDULER_NAME = "gpupool"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_FRACTION = "gpupool.io/gpu"
QUEUE_LABEL = "gpupool.io/queue"
GROUP_LABEL = "gpupool.io/pod-group"
MIN_MEMBER = "gpupool.io/min-member"
ESTIMATE = "gpupool.io/runtime-estimate"
DEVICES = "gpupool.io/gpu-devices"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
SITE_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
RACK_LABEL = "topology.kubernetes.io/rack"
#: a pod past these phases holds nothing
DONE_PHASES = ("Succeeded", "Failed")


class Malformed(ValueError):
    """A pod's request gpupool cannot read; the message names the field or annotation."""


@dataclass(frozen=True)
class KubeNode:
    name: str
    spec: NodeSpec
    #: takes new pods: not cordoned (spec.unschedulable) and Ready
    ready: bool
    labels: dict[str, str]
    #: (key, value, effect) of its NoSchedule and NoExecute taints
    taints: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class KubePod:
    key: str  # namespace/name
    uid: str
    namespace: str
    name: str
    node: str  # "" while unbound
    phase: str
    ours: bool  # spec.schedulerName is gpupool
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str]
    annotations: dict[str, str]
    priority: int
    created: float
    deadline_s: float | None
    deleting: bool
    spec: dict[str, Any] = field(repr=False, compare=False)  # the pod's spec
    #: what restricts its nodes (constraints.py), and the tag naming that, worked out once per version of the pod
    asks: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    tag: str = ""
    #: epoch seconds, from its status where it says: bound (PodScheduled=True), started (its containers, else
    #: startTime) and ended (its containers' finish, else when its Ready condition last changed, once done)
    bound_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.phase in DONE_PHASES


def quantity(value: Any, unit: Decimal) -> int:
    """A Kubernetes quantity ("500m", "2", "4Gi", "1e3") in `unit`s (Decimal(1)/1000 for milli), rounded up."""
    from kubernetes.utils import parse_quantity  # the client's own parser; lazy: imported only with a kubeconfig

    amount = parse_quantity(value) / unit
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))


MILLI = Decimal(1) / 1000
MIB = Decimal(1 << 20)


def node_of(obj: dict[str, Any]) -> KubeNode:
    """A Node object as gpupool sees it: GPUs from allocatable nvidia.com/gpu, their model and memory from GPU
    feature discovery's labels, site and rack from topology labels, CPU and memory from allocatable."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    gpus = quantity(alloc.get(GPU_RESOURCE, "0"), Decimal(1))
    model = labels.get(PRODUCT_LABEL, "")
    memory = int(labels[GPU_MEMORY_LABEL]) if labels.get(GPU_MEMORY_LABEL, "").isdigit() else 0
    devices = tuple(GpuDevice(i, model, memory, f"{meta['name']}/gpu{i}") for i in range(gpus))
    site = next((labels[k] for k in SITE_LABELS if labels.get(k)), "")
    node = NodeSpec(meta["name"], quantity(alloc.get("cpu", "0"), MILLI), quantity(alloc.get("memory", "0"), MIB),
                    devices, site, labels.get(RACK_LABEL, ""))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    taints = tuple((t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in spec.get("taints") or []
                   if t.get("effect") in ("NoSchedule", "NoExecute"))
    return KubeNode(meta["name"], node, ready and not spec.get("unschedulable"), dict(labels), taints)


def pod_of(obj: dict[str, Any]) -> KubePod:
    """A Pod object; its CPU and memory are the sum of its containers' requests (limits where no request)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    cpu = memory = 0
    for container in spec.get("containers") or []:
        res = container.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        cpu += quantity(asked.get("cpu", "0"), MILLI)
        memory += quantity(asked.get("memory", "0"), MIB)
    deadline = spec.get("activeDeadlineSeconds")
    asks = constraints(spec)
    return KubePod(f"{meta['namespace']}/{meta['name']}", meta.get("uid", ""), meta["namespace"], meta["name"],
                   spec.get("nodeName") or "", status.get("phase", "Pending"),
                   spec.get("schedulerName") == SCHEDULER_NAME, cpu, memory, dict(meta.get("labels") or {}),
                   dict(meta.get("annotations") or {}), int(spec.get("priority") or 0),
                   _timestamp(meta.get("creationTimestamp")), float(deadline) if deadline else None,
                   bool(meta.get("deletionTimestamp")), spec, asks, signature(asks), *_times(status))


def _timestamp(value: str | None) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


def _times(status: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(bound, started, ended) as the pod's status says them (None where it does not)."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    bound = _timestamp(scheduled.get("lastTransitionTime")) or None if scheduled.get("status") == "True" else None
    states = [s.get("state") or {} for s in status.get("containerStatuses") or []]
    starts = [_timestamp(s.get("startedAt")) for x in states for s in (x.get("running"), x.get("terminated")) if s]
    ends = [_timestamp(x["terminated"].get("finishedAt")) for x in states if x.get("terminated")]
    started = min(filter(None, starts), default=None) or _timestamp(status.get("startTime")) or None
    ended = None
    if status.get("phase") in DONE_PHASES:
        ready = conditions.get("Ready") or {}
        ended = max(filter(None, ends), default=None) or _timestamp(ready.get("lastTransitionTime")) or None
    return bound, started, ended


def gpu_milli(pod: KubePod) -> tuple[int, int]:
    """(gpu_count, milli per GPU) the pod asks: the `gpupool.io/gpu` annotation, else the GPU limit.
    Raises Malformed naming the annotation or limit."""
    raw = pod.annotations.get(GPU_FRACTION)
    if raw is not None:
        return _fraction(raw)
    limits = [(c.get("resources") or {}).get("limits") or {} for c in pod.spec.get("containers") or []]
    total = 0
    for limit in limits:
        try:
            total += int(Decimal(str(limit.get(GPU_RESOURCE, 0))))
        except (InvalidOperation, ValueError):
            raise Malformed(f'limit {GPU_RESOURCE}: "{limit.get(GPU_RESOURCE)}" is not a whole number') from None
    return (total, 1000) if total else (0, 0)


def _fraction(raw: str) -> tuple[int, int]:
    shown = raw[:40]
    try:
        Decimal(raw.strip())
    except InvalidOperation:
        raise Malformed(f'annotation {GPU_FRACTION}: "{shown}" is not a number of GPUs') from None
    try:
        milli = gpus_to_milli(raw.strip())
    except ValueError as exc:
        raise Malformed(f'annotation {GPU_FRACTION}: "{shown}": {exc}') from None
    if milli == 0:
        raise Malformed(f'annotation {GPU_FRACTION}: "{shown}": must be more than 0')
    return (1, milli) if milli < 1000 else (milli // 1000, 1000)


def shape_of(pod: KubePod, node_labels: tuple[str, ...] = ()) -> TaskShape:
    count, milli = gpu_milli(pod)
    return TaskShape(pod.cpu_milli, pod.memory_mib, count, milli, node_labels=node_labels)


def min_member(pod: KubePod) -> int:
    """The gang's size from `gpupool.io/min-member` (1 without a group)."""
    if GROUP_LABEL not in pod.labels:
        return 1
    raw = pod.annotations.get(MIN_MEMBER, "1")
    if not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise Malformed(f'annotation {MIN_MEMBER}: "{raw}" is not a whole number from 1 to 10000')
    return int(raw)


def estimate_s(pod: KubePod) -> float | None:
    raw = pod.annotations.get(ESTIMATE)
    if raw is None:
        return None
    scale = {"s": 1, "m": 60, "h": 3600}.get(raw[-1:], 0)
    number = raw[:-1] if scale else raw
    try:
        value = float(Decimal(number)) * (scale or 1)
    except InvalidOperation:
        value = -1.0
    if not 0 < value < 1e9:
        raise Malformed(f'annotation {ESTIMATE}: "{raw}" is not a duration (seconds, or 90s, 30m, 2h)')
    return value


def devices_text(shares: tuple[DeviceShare, ...]) -> str:
    return ",".join(f"{s.index}:{s.milli}" for s in shares)


def devices_of(pod: KubePod, gpus: int) -> tuple[DeviceShare, ...] | None:
    """The shares gpupool recorded on a bound pod (`gpupool.io/gpu-devices`); None if absent or unreadable."""
    raw = pod.annotations.get(DEVICES)
    if not raw:
        return None
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in raw.split(",")]
        shares = tuple(DeviceShare(i, m) for i, m in pairs)
    except ValueError:
        return None
    return shares if all(0 <= s.index < gpus and 0 < s.milli <= 1000 for s in shares) else None
