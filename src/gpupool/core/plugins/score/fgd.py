"""FGD, Fragmentation Gradient Descent (Weng et al., ATC'23), benchmark mode (ALGORITHMS.md §2.3).

A node scores trunc(100 * sigmoid((F_n - F_n') / 1000)), where F is the workload-aware fragmentation
of `gpupool.core.fragmentation` and n' the node after placement. A fraction is tried on every GPU
that fits; the node keeps the best GPU's score and the lowest-index GPU reaching it. Whole GPUs are
the lowest-index fully free ones. CPU-only tasks are scored too (only their CPU changes F).
"""

from __future__ import annotations

import math
import random

from gpupool.core.fit import fitting_gpus, fraction_share, lowest_whole_gpus
from gpupool.core.fragmentation import FragModel, Workload
from gpupool.core.framework import DevicePlugin, ScorePlugin
from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState


def sigmoid_score(delta: float) -> int:
    """trunc(100 * sigmoid(delta / 1000)) for a fragmentation decrease `delta` in milli-GPU."""
    return int(100.0 / (1.0 + math.exp(-delta / 1000.0)))


class FgdPolicy(ScorePlugin, DevicePlugin):
    name = "fgd"

    def __init__(self, workload: Workload) -> None:
        self.frag = self.frag_model(workload)

    def frag_model(self, workload: Workload) -> FragModel:
        """The fragmentation measure this policy descends (plain FGD: F_n(M))."""
        return FragModel(workload)

    def frag_for(self, shape: TaskShape) -> FragModel:
        """The fragmentation measure a task of `shape` descends (plain FGD: F_n(M) for every task)."""
        return self.frag

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        return self._best(kind, state, shape)[0]

    def pick_devices(
        self, kind: NodeKind, state: NodeState, shape: TaskShape, rng: random.Random
    ) -> tuple[DeviceShare, ...]:
        if not shape.is_shared:
            return lowest_whole_gpus(state, shape)
        return fraction_share(shape, self._best(kind, state, shape)[1])

    def _best(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> tuple[int, int]:
        frag = self.frag_for(shape).frag
        before = frag(kind.model, state.cpu_free, state.gpu_free)
        cpu_after = state.cpu_free - shape.cpu_milli
        if not shape.is_shared:
            taken = {s.index for s in lowest_whole_gpus(state, shape)}
            after = tuple(0 if g in taken else r for g, r in enumerate(state.gpu_free))
            return sigmoid_score(before - frag(kind.model, cpu_after, after)), -1
        best, best_gpu = -1, -1
        for g in fitting_gpus(state, shape):
            after = tuple(r - shape.gpu_milli if i == g else r for i, r in enumerate(state.gpu_free))
            s = sigmoid_score(before - frag(kind.model, cpu_after, after))
            if s > best:
                best, best_gpu = s, g
        return best, best_gpu
