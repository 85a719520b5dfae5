"""Frozen specs: GPU devices, nodes, task shapes, tasks and jobs (gangs).

A `Job` is a gang of `Task`s that starts all-or-nothing once `min_tasks` of them are placed.
A `TaskShape` is what one task asks of one node; placement caches are keyed by it, so two tasks
with equal shapes are interchangeable for every placement policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core.resources import ResourceVector
from gpupool.core.units import CPU, GPU, GPU_MEMORY, MEMORY, MILLI


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU (or MIG instance) of a node, addressed by its index on that node."""

    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    numa_node: int = 0
    nvlink_group: int = 0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """What a node has when empty. `gpus` are in device-index order; all share one model in practice.

    `untrusted_images`: the node may run container images of any tenant (its container toolkit is recent enough;
    the control plane sets it from the agent's check, simulated nodes keep the default). Tasks with an image
    (`TaskShape.has_image`) go only to such nodes.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    site: str = ""
    rack: str = ""
    untrusted_images: bool = True
    labels: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name: must not be empty")
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"node {self.name}: cpu_milli and memory_mib must be non-negative")
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError(f"node {self.name}: GPU indices must be 0..{len(self.gpus) - 1} in order")

    @property
    def gpu_model(self) -> str:
        """The model of the node's first GPU, "" for CPU-only nodes."""
        return self.gpus[0].model if self.gpus else ""


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One task's request on one node.

    `gpu_count` GPUs of `gpu_milli` each; `gpu_milli < 1000` (a shared GPU) only with `gpu_count == 1`.
    `gpu_models` lists acceptable GPU models (empty = any). `gpu_memory_mib` is per GPU.

    `share_group` is who a shared GPU may be shared with (the control plane: the job's organisation; "" = no
    tenancy, which shares only with ""): a fraction goes to a fully free GPU or to one whose group is its own. It
    is kept only on fractions ("" otherwise), so whole-GPU and CPU shapes of every tenant stay one cache key.
    `has_image`: the task runs a container image, so it needs a node with `untrusted_images`.
    `node_labels`: constraint tags (sorted) the node must have among its `NodeSpec.labels`; () = any node.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    share_group: str = ""
    has_image: bool = False
    node_labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("cpu_milli", "memory_mib", "gpu_count", "gpu_milli", "gpu_memory_mib"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name}: must be a non-negative integer, got {value!r}")
        if self.gpu_milli > MILLI:
            raise ValueError(f"gpu_milli: at most {MILLI} per GPU, got {self.gpu_milli}")
        if self.gpu_count == 0 and self.gpu_milli:
            raise ValueError("gpu_milli: must be 0 when gpu_count is 0")
        if self.gpu_count > 0 and self.gpu_milli == 0:
            raise ValueError("gpu_milli: must be positive when gpu_count is positive")
        if self.gpu_count > 1 and self.gpu_milli != MILLI:
            raise ValueError("gpu_milli: a fraction of a GPU is only allowed with gpu_count 1")
        if tuple(sorted(set(self.gpu_models))) != self.gpu_models:
            object.__setattr__(self, "gpu_models", tuple(sorted(set(self.gpu_models))))
        if tuple(sorted(set(self.node_labels))) != self.node_labels:
            object.__setattr__(self, "node_labels", tuple(sorted(set(self.node_labels))))
        if self.share_group and not self.is_shared:
            object.__setattr__(self, "share_group", "")

    @property
    def is_shared(self) -> bool:
        """True for a fraction of one GPU."""
        return self.gpu_count == 1 and self.gpu_milli < MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    def resources(self) -> ResourceVector:
        return ResourceVector(
            {
                GPU: self.total_gpu_milli,
                CPU: self.cpu_milli,
                MEMORY: self.memory_mib,
                GPU_MEMORY: self.gpu_memory_mib * self.gpu_count,
            }
        )

    def allows_model(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models

    def allows_labels(self, labels: frozenset[str]) -> bool:
        """Whether a node with constraint tags `labels` may take the task."""
        return not self.node_labels or labels.issuperset(self.node_labels)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    id: str
    shape: TaskShape


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A gang: it starts only when at least `min_tasks` of `tasks` are placed in one cycle.

    `runtime_limit_s` is the user's limit (None = unbounded); `runtime_estimate_s` is what backfill
    plans with (the limit, or a predictor's output).
    """

    id: str
    tasks: tuple[TaskSpec, ...]
    queue: str = "default"
    min_tasks: int = 0
    priority: int = 0
    submitted_at: float = 0.0
    preemptible: bool = True
    checkpointable: bool = False
    runtime_limit_s: float | None = None
    runtime_estimate_s: float | None = None
    user: str = ""
    tags: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"job {self.id}: has no tasks")
        if self.min_tasks == 0:
            object.__setattr__(self, "min_tasks", len(self.tasks))
        if not 1 <= self.min_tasks <= len(self.tasks):
            raise ValueError(f"job {self.id}: min_tasks must be in 1..{len(self.tasks)}")

    @property
    def estimate_s(self) -> float | None:
        """The runtime backfill plans with: the estimate, else the limit, else None (unknown)."""
        return self.runtime_estimate_s if self.runtime_estimate_s is not None else self.runtime_limit_s

    def resources(self) -> ResourceVector:
        total = ResourceVector()
        for task in self.tasks:
            total = total + task.shape.resources()
        return total


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """`milli` of GPU `index` on the chosen node, with `memory_mib` of its memory."""

    index: int
    milli: int
    memory_mib: int = 0
