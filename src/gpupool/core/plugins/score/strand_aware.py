"""Stranding-aware FGD: gpupool's recommended placement (`--policy best`); see docs/design/placement.md.

FGD descends the workload-aware fragmentation F_n(M), which asks only whether the *next* task could
still use a node. It misses GPUs stranded by CPU: a node whose free CPU cannot feed its idle GPUs at
the workload's CPU-per-GPU ratio will leave those GPUs idle however the next tasks are drawn. This
policy descends F_n(M) + w * max(0, idle_gpu - free_cpu / cpu_per_gpu), everything else as FGD.
"""

from __future__ import annotations

from gpupool.core.fragmentation import FragModel, Workload
from gpupool.core.plugins.score.fgd import FgdPolicy

DEFAULT_STRAND_WEIGHT = 2.0


class StrandAwarePolicy(FgdPolicy):
    name = "strand_aware"

    def __init__(self, workload: Workload, strand_weight: float = DEFAULT_STRAND_WEIGHT) -> None:
        if strand_weight < 0:
            raise ValueError("strand_weight: must be >= 0")
        self.strand_weight = strand_weight
        super().__init__(workload)

    def frag_model(self, workload: Workload) -> FragModel:
        return FragModel(workload, self.strand_weight)
