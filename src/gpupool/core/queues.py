"""The queue tree: organisation -> department -> project, any depth; jobs live in leaf queues.

Quota resources are named: "gpu" is GPU units (milli-GPU weighted by the per-model unit, so an
H100 hour is not a T4 hour), "gpu:<model>" is raw milli-GPU of one model, and "cpu_milli" and
"memory_mib" are as everywhere. A queue's `guaranteed` is its nominal quota; `limit` caps it
(missing resource = no cap); `borrow_limit` caps how far above `guaranteed` it may go and
`lend_limit` how much of its unused guarantee siblings may use (missing = unbounded / all), with
Kueue's cohort semantics among siblings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.resources import ResourceVector
from gpupool.core.units import CPU, MEMORY, MILLI

GPU_UNITS = "gpu"
NON_PREEMPTIBLE = "np:"
DEFAULT_UNIT = MILLI  # one GPU of an unlisted model counts one GPU unit
#: distinct (CPU, memory, milli-GPU, model, preemptible) charges a tree remembers before it starts again
CHARGES_KEPT = 10_000


def model_resource(model: str) -> str:
    return f"gpu:{model}"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    parent: str | None = None
    guaranteed: ResourceVector = field(default_factory=ResourceVector)
    limit: ResourceVector | None = None
    over_quota_weight: int = 1
    borrow_limit: ResourceVector | None = None
    lend_limit: ResourceVector | None = None
    priority: int = 0
    preempt_min_runtime_s: float = 0.0
    reclaim_min_runtime_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"queue name: {self.name!r} must be non-empty without '/'")
        if self.over_quota_weight < 0:
            raise ValueError(f"queue {self.name}: over_quota_weight must be >= 0")
        if self.preempt_min_runtime_s < 0 or self.reclaim_min_runtime_s < 0:
            raise ValueError(f"queue {self.name}: min runtimes must be >= 0")


class QueueTree:
    """A validated forest of queues with parent/children lookups and leaf-to-root paths."""

    def __init__(self, specs: Iterable[QueueSpec], gpu_units: Mapping[str, int] | None = None) -> None:
        self.specs: dict[str, QueueSpec] = {}
        for spec in specs:
            if spec.name in self.specs:
                raise ValueError(f"queue {spec.name}: declared twice")
            self.specs[spec.name] = spec
        self.children: dict[str | None, list[str]] = {}
        for spec in self.specs.values():
            if spec.parent is not None and spec.parent not in self.specs:
                raise ValueError(f"queue {spec.name}: parent {spec.parent!r} is not declared")
            self.children.setdefault(spec.parent, []).append(spec.name)
        for names in self.children.values():
            names.sort()
        self.paths = {name: self._path(name) for name in self.specs}
        #: values readers derive from the tree alone, cached under a key of their own (the tree never changes)
        self.derived: dict[object, object] = {}
        #: resources some queue sets a guarantee, limit, borrow or lend limit for; others need no checks
        self.constrained = frozenset(r for s in self.specs.values() for v in
                                     (s.guaranteed, s.limit, s.borrow_limit, s.lend_limit) if v for r in v)
        self.gpu_units = dict(gpu_units or {})
        for model, unit in self.gpu_units.items():
            if unit <= 0:
                raise ValueError(f"gpu_units: {model} must be a positive number of milli-units per GPU")

    def _path(self, name: str) -> tuple[str, ...]:
        path, seen = [], set()
        current: str | None = name
        while current is not None:
            if current in seen:
                raise ValueError(f"queue {name}: its parents form a cycle")
            seen.add(current)
            path.append(current)
            current = self.specs[current].parent
        return tuple(path)

    def checks(self, resource: str) -> bool:
        """Do the admission rules read `resource` (some queue constrains it, or it counts non-preemptible use)?"""
        return resource in self.constrained or resource.startswith(NON_PREEMPTIBLE)

    def is_leaf(self, name: str) -> bool:
        return name in self.specs and not self.children.get(name)

    @property
    def leaves(self) -> list[str]:
        return sorted(n for n in self.specs if self.is_leaf(n))

    @property
    def roots(self) -> list[str]:
        return list(self.children.get(None, []))

    def siblings(self, name: str) -> list[str]:
        return [s for s in self.children.get(self.specs[name].parent, []) if s != name]

    def charge(self, shape: TaskShape, shares: Iterable[DeviceShare], model: str,
               preemptible: bool = True) -> ResourceVector:
        """What one placed task counts against its queues on a node of GPU `model`.

        A non-preemptible task's GPU units count a second time under "np:gpu", which must stay within
        the guarantee.
        """
        milli = sum([s.milli for s in shares])
        key = (shape.cpu_milli, shape.memory_mib, milli, model, preemptible)
        memo = self.derived.get(QueueTree.charge)
        if not isinstance(memo, dict) or len(memo) >= CHARGES_KEPT:
            memo = self.derived[QueueTree.charge] = {}
        charge = memo.get(key)
        if charge is None:
            amounts = {CPU: shape.cpu_milli, MEMORY: shape.memory_mib}
            if milli:
                amounts[GPU_UNITS] = milli * self.gpu_units.get(model, DEFAULT_UNIT) // MILLI
                amounts[model_resource(model)] = milli
                if not preemptible:
                    amounts[NON_PREEMPTIBLE + GPU_UNITS] = amounts[GPU_UNITS]
            charge = memo[key] = ResourceVector._trusted(amounts)  # from a validated shape and shares
        return charge
