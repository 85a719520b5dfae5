"""Cluster and job metrics (ALGORITHMS.md §1.2 and §2.2), shared by the simulator and the control plane.

All functions are pure. Percentiles are nearest-rank with an exact integer rank (ALGORITHMS.md §0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gpupool.core.fragmentation import FragModel
from gpupool.core.nodes import NodeTable

#: JWTD histogram bucket upper bounds in seconds: [0,1m) [1m,10m) [10m,1h) [1h,6h) [6h,24h) [24h,inf)
WAIT_BUCKETS_S = (60, 600, 3600, 21600, 86400)
#: JTTED buckets of actual/estimate: <0.5, [0.5,0.9), [0.9,1.1), [1.1,2), >=2
ESTIMATE_BUCKETS = (Fraction(1, 2), Fraction(9, 10), Fraction(11, 10), Fraction(2))


def nearest_rank(values: Sequence[float], numerator: int, denominator: int = 100) -> float:
    """P_q with q = numerator/denominator: x_ceil(q n) of the sorted values; the rank is exact integers."""
    if not values:
        raise ValueError("nearest_rank: no values")
    if not 0 < numerator <= denominator:
        raise ValueError("nearest_rank: q must be in (0, 1]")
    ordered = sorted(values)
    rank = (numerator * len(ordered) + denominator - 1) // denominator
    return ordered[rank - 1]


def histogram(values: Iterable[float], bounds: Sequence[float]) -> list[int]:
    """Counts per bucket [.., b0) [b0, b1) ... [b_last, inf)."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[sum(1 for b in bounds if value >= b)] += 1
    return counts


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    """Instantaneous figures over schedulable nodes (milli-GPU unless named otherwise)."""

    capacity_milli: int
    allocated_milli: int
    nodes: int
    fragmented_nodes: int
    fragmented_free_milli: int
    free_milli: int
    gpus_unavailable: int

    @property
    def gar(self) -> Fraction:
        """GPU allocation ratio: allocated / capacity of schedulable GPUs."""
        return Fraction(self.allocated_milli, self.capacity_milli) if self.capacity_milli else Fraction(0)

    @property
    def unallocated_gpus(self) -> Fraction:
        return Fraction(self.capacity_milli - self.allocated_milli, 1000)

    @property
    def gfr(self) -> Fraction:
        """Share of GPU nodes with idle GPU that cannot host a whole-node job."""
        return Fraction(self.fragmented_nodes, self.nodes) if self.nodes else Fraction(0)

    @property
    def gfr_gpu(self) -> Fraction:
        """GPU-weighted GFR: idle milli-GPU on fragmented nodes / all idle milli-GPU (0/0 = 0)."""
        return Fraction(self.fragmented_free_milli, self.free_milli) if self.free_milli else Fraction(0)


def cluster_figures(table: NodeTable) -> ClusterFigures:
    capacity = allocated = nodes = fragmented = frag_free = free_total = unavailable = 0
    for kind, state in zip(table.kinds, table.states, strict=True):
        if not kind.gpu_count:
            continue
        if not state.schedulable:
            unavailable += kind.gpu_count
            continue
        free = state.gpu_idle
        nodes += 1
        capacity += kind.gpu_milli
        allocated += kind.gpu_milli - free
        free_total += free
        if 0 < free < kind.gpu_milli:
            fragmented += 1
            frag_free += free
    return ClusterFigures(capacity, allocated, nodes, fragmented, frag_free, free_total, unavailable)


def fragmentation_milli(table: NodeTable, model: FragModel) -> float:
    """FGD fragmentation amount F(M) summed over schedulable nodes, in milli-GPU."""
    return sum(model.frag(k.model, s.cpu_free, s.gpu_free)
               for k, s in zip(table.kinds, table.states, strict=True) if s.schedulable)


@dataclass(frozen=True, slots=True)
class Interval:
    """GPU milli held over [start, end): running when `held_idle` is False, reserved-but-idle otherwise."""

    start: float
    end: float
    gpu_milli: int
    held_idle: bool = False


def window_ratios(intervals: Iterable[Interval], capacity_milli: int, t0: float, t1: float) -> tuple[float, float]:
    """(GAR over the window, SOR over the window) for a constant capacity.

    GAR counts running intervals; SOR also counts GPU held idle by the scheduler (reservations).
    """
    if t1 <= t0 or capacity_milli <= 0:
        raise ValueError("window_ratios: need t1 > t0 and a positive capacity")
    running = held = 0.0
    for iv in intervals:
        overlap = max(0.0, min(iv.end, t1) - max(iv.start, t0)) * iv.gpu_milli
        held += overlap
        if not iv.held_idle:
            running += overlap
    denominator = capacity_milli * (t1 - t0)
    return running / denominator, held / denominator
