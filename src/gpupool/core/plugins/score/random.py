"""Random: every feasible node scores the same; the profile's random tie-break then draws one
uniformly with the cycle's seeded RNG (ALGORITHMS.md §2.4, baseline 1)."""

from __future__ import annotations

from gpupool.core.framework import ScorePlugin
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState


class RandomScore(ScorePlugin):
    name = "random"

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        return 0
