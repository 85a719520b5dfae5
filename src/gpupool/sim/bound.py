"""LP-relaxation upper bound on GPU allocation (BENCHMARKS.md §6), solved with scipy's HiGHS.

Nodes are grouped into configurations k (model, GPUs, CPU, memory) with N_k nodes; tasks into
classes t with the count expected to have arrived at demand level x (the pod list scaled so that its
GPU request is x times capacity). Variables x_tk >= 0 are (fractional) tasks of t on configuration k:

    maximise   sum_tk gpu_t x_tk
    subject to sum_t cpu_t x_tk <= N_k cpu_k, sum_t mem_t x_tk <= N_k mem_k, sum_t gpu_t x_tk <= N_k gpu_k
               sum_k x_tk <= n_t, and x_tk = 0 where one task of t cannot fit one node of k.

The bound may leave tasks out (the online protocol may not), so it is an upper bound for every
policy; it is tight only where GPU-model constraints or whole-node shapes bind in aggregate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy import optimize, sparse

from gpupool.core import NodeSpec, TaskShape


@dataclass(frozen=True, slots=True)
class Bound:
    demand: Fraction
    capacity_milli: int
    allocated_milli: float

    @property
    def pct(self) -> float:
        return 100.0 * self.allocated_milli / self.capacity_milli


def _fits(shape: TaskShape, config: tuple[str, int, int, int]) -> bool:
    model, gpus, cpu, mem = config
    if shape.gpu_count and (shape.gpu_count > gpus or not shape.allows_model(model)):
        return False
    return shape.cpu_milli <= cpu and shape.memory_mib <= mem


def lp_bound(nodes: Sequence[NodeSpec], shapes: Sequence[TaskShape], demand: Fraction) -> Bound:
    """The LP upper bound on allocated milli-GPU once `demand` x capacity has arrived."""
    configs = Counter((n.gpu_model, len(n.gpus), n.cpu_milli, n.memory_mib) for n in nodes)
    classes = Counter(shapes)
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    requested = sum(s.total_gpu_milli for s in shapes)
    if capacity == 0 or requested == 0:
        raise ValueError("bound: need GPU capacity and GPU demand")
    scale = float(demand) * capacity / requested
    config_list, class_list = list(configs), [s for s in classes if s.total_gpu_milli]
    pairs = [(t, k) for t, s in enumerate(class_list) for k, c in enumerate(config_list) if _fits(s, c)]
    if not pairs:
        return Bound(demand, capacity, 0.0)
    rows, cols, vals = [], [], []
    for j, (t, k) in enumerate(pairs):
        s = class_list[t]
        for r, amount in enumerate((s.cpu_milli, s.memory_mib, s.total_gpu_milli)):
            rows.append(3 * k + r)
            cols.append(j)
            vals.append(amount)
        rows.append(3 * len(config_list) + t)
        cols.append(j)
        vals.append(1)
    a_ub = sparse.csr_matrix((vals, (rows, cols)), shape=(3 * len(config_list) + len(class_list), len(pairs)))
    b_ub = [v for (model, gpus, cpu, mem), n in configs.items() for v in (n * cpu, n * mem, n * gpus * 1000)]
    b_ub += [classes[s] * scale for s in class_list]
    cost = -np.array([class_list[t].total_gpu_milli for t, _ in pairs], dtype=float)
    result = optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if not result.success:
        raise RuntimeError(f"bound: HiGHS failed: {result.message}")
    return Bound(demand, capacity, min(float(-result.fun), float(demand) * capacity))
