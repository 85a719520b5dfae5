"""FGD's workload-aware GPU fragmentation (ALGORITHMS.md §2.1-2.2), shared by the `fgd` policy and
the fragmentation metrics.

A `Workload` is the target task-class distribution M (and, when known, the cluster's GPUs per model, which
`best`'s scarcity term needs). `frag(kind, cpu_free, gpu_free)` is F_n(M):
the idle milli-GPU of a node that the next task, drawn from M, could not use. It depends only on the
node's model, free CPU and the multiset of free milli-GPU per device, so it is memoised by those.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpupool.core.model import TaskShape

_MEMO_LIMIT = 1_000_000
_MAX_CORES = 256


@dataclass(frozen=True, slots=True)
class TaskClass:
    """FGD class key: CPU (0 read as 100), per-GPU milli (0 for CPU-only), GPU count, model list."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    gpu_models: tuple[str, ...] = ()

    @classmethod
    def of(cls, shape: TaskShape) -> TaskClass:
        return cls(shape.cpu_milli or 100, shape.gpu_milli, shape.gpu_count, shape.gpu_models)

    def sort_key(self) -> tuple[int, int, int, str]:
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(self.gpu_models))


@dataclass(frozen=True, slots=True)
class Workload:
    """Task classes with popularities summing to 1, and the GPUs per model they will meet (empty: unknown)."""

    classes: tuple[TaskClass, ...]
    popularity: tuple[float, ...]
    supply: tuple[tuple[str, int], ...] = ()

    def with_supply(self, gpus_per_model: Mapping[str, int]) -> Workload:
        return replace(self, supply=tuple(sorted(gpus_per_model.items())))

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape], coverage: float = 0.95) -> Workload:
        """The most popular classes covering >= `coverage` of tasks (FGD's typical-pod rule).

        Classes are ranked by count, then by key descending, taken one at a time until the kept
        count reaches `coverage` of all tasks, and renormalised.
        """
        counts = Counter(TaskClass.of(s) for s in shapes)
        if not counts:
            raise ValueError("workload: no task shapes to learn from")
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        kept: list[tuple[TaskClass, int]] = []
        for item in ranked:
            kept.append(item)
            if sum(c for _, c in kept) >= coverage * total:
                break
        kept_total = sum(c for _, c in kept)
        return cls(tuple(k for k, _ in kept), tuple(c / kept_total for _, c in kept))


class FragModel:
    """F_n(M) for one workload, memoised by (model, free CPU, sorted free milli-GPU).

    Three terms of `best` (docs/design/placement.md) come on top with positive weights; plain FGD and the
    fragmentation metric use none:
    - `strand_weight`: CPU stranding, the idle milli-GPU that the node's free CPU could not feed at the
      workload's mean CPU per GPU (`cpu_per_gpu`, milli-CPU per milli-GPU over GPU classes);
    - `scarcity_weight`: the node's used milli-GPU times its model's `pressure` (`model_pressure`), so that
      a task that could run anywhere leaves the models other tasks are confined to;
    - `leftover_weight`: the sum over partly used GPUs of `Leftovers.least`, the idle milli-GPU that no
      combination of the workload's fractional classes could fill there.
    """

    def __init__(self, workload: Workload, strand_weight: float = 0.0, scarcity_weight: float = 0.0,
                 leftover_weight: float = 0.0) -> None:
        self.workload = workload
        self.strand_weight = strand_weight
        self.scarcity_weight = scarcity_weight
        self.leftover_weight = leftover_weight
        gpu = [(c, p) for c, p in zip(workload.classes, workload.popularity, strict=True) if c.gpu_milli]
        self._cpu_only_p = sum(p for c, p in zip(workload.classes, workload.popularity, strict=True)
                               if not c.gpu_milli)
        self._gpu_classes = tuple((c.cpu_milli, c.gpu_milli, c.gpu_count, frozenset(c.gpu_models), p)
                                  for c, p in gpu)
        gpu_demand = sum(p * c.gpu_milli * c.gpu_count for c, p in gpu)
        self.cpu_per_gpu = sum(p * c.cpu_milli for c, p in gpu) / gpu_demand if gpu_demand else 0.0
        self.pressure = model_pressure(workload) if scarcity_weight else {}
        self.leftovers = Leftovers(workload)
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    def frag(self, model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> float:
        """Expected unusable idle milli-GPU on a node in this state; 0 for nodes without GPUs."""
        if not gpu_free:
            return 0.0
        key = (model, cpu_free, tuple(sorted(gpu_free)))
        value = self._memo.get(key)
        if value is None:
            value = self._frag(model, cpu_free, key[2])
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = value
        return value

    def _frag(self, model: str, cpu_free: int, free: tuple[int, ...]) -> float:
        idle = sum(free)
        total = self._cpu_only_p * idle
        for cpu, milli, count, models, p in self._gpu_classes:
            if cpu_free < cpu or (models and model not in models):
                total += p * idle
                continue
            fitting = sum(1 for r in free if r >= milli)
            if fitting < count:
                total += p * idle
            else:
                total += p * sum(r for r in free if r < milli)
        if self.strand_weight and self.cpu_per_gpu:
            total += self.strand_weight * max(0.0, idle - cpu_free / self.cpu_per_gpu)
        pressure = self.pressure.get(model)
        if pressure:
            total += self.scarcity_weight * pressure * (1000 * len(free) - idle)
        if self.leftover_weight:
            least = self.leftovers.least
            total += self.leftover_weight * sum(least(model, r, cpu_free) for r in free if r < 1000)
        return total


class Leftovers:
    """`least(model, free_milli, cpu_free)`: the least idle milli-GPU that tasks of the workload's fractional
    classes (one GPU, under 1000 milli, allowed on `model`) could leave on one GPU with `free_milli` free,
    stacking any number of them, when the node has `cpu_free` milli-CPU for them (counted in whole cores:
    a class's CPU rounded up, the node's down, so the figure is never optimistic). It is 0 when some
    combination fills the GPU exactly, and `free_milli` when no class fits.

    Rows (every core count for one model and free amount) are built on first use from smaller free
    amounts; a node's CPU beyond what a GPU's worth of classes could use (or 256 cores) is read as that much.
    """

    def __init__(self, workload: Workload) -> None:
        self._classes = tuple(sorted({(c.gpu_milli, -(-c.cpu_milli // 1000), frozenset(c.gpu_models))
                                      for c in workload.classes
                                      if c.gpu_count == 1 and 0 < c.gpu_milli < 1000}, key=repr))
        smallest = min((m for m, _, _ in self._classes), default=1000)
        self._cores = min(_MAX_CORES, (1000 // smallest) * max((k for _, k, _ in self._classes), default=0))
        self._rows: dict[tuple[str, int], tuple[int, ...]] = {}

    def least(self, model: str, free_milli: int, cpu_free: int) -> int:
        return self._row(model, free_milli)[min(cpu_free // 1000, self._cores)]

    def _row(self, model: str, free_milli: int) -> tuple[int, ...]:
        todo = [free_milli]
        while todo:
            free = todo[-1]
            if (model, free) in self._rows:
                todo.pop()
                continue
            fits = [(m, k) for m, k, models in self._classes if m <= free and (not models or model in models)]
            missing = [free - m for m, _ in fits if (model, free - m) not in self._rows]
            if missing:
                todo.extend(missing)
                continue
            best = [free] * (self._cores + 1)
            for m, k in fits:
                rest = self._rows[(model, free - m)]
                for c in range(k, self._cores + 1):
                    best[c] = min(best[c], rest[c - k])
            self._rows[(model, free)] = tuple(best)
            todo.pop()
        return self._rows[(model, free_milli)]


def model_pressure(workload: Workload) -> dict[str, float]:
    """Per GPU model of `workload.supply`: the share of the workload's GPU demand that only that model (or a
    list it is on) can serve, over the model's share of the supply. A class allowed on several models is
    split between them by supply. 1.0 means the confined demand alone would take the model's whole share;
    models nothing is confined to are left out (pressure 0)."""
    supply = {m: n for m, n in workload.supply if n > 0}
    gpu = [(c, p * c.gpu_milli * c.gpu_count) for c, p in zip(workload.classes, workload.popularity, strict=True)
           if c.gpu_milli and c.gpu_count]
    demand, total_supply = sum(d for _, d in gpu), sum(supply.values())
    if not demand or not total_supply:
        return {}
    confined: dict[str, float] = {}
    for c, d in gpu:
        allowed = [m for m in set(c.gpu_models) if m in supply]
        room = sum(supply[m] for m in allowed)
        for m in allowed:
            confined[m] = confined.get(m, 0.0) + d * supply[m] / room
    return {m: (need / demand) / (supply[m] / total_supply) for m, need in confined.items()}

