"""Two gpupool plugins, published under the entry-point group `gpupool.plugins` (see pyproject.toml).

`gpu_tight` (a score plugin): the node the task leaves with the least idle GPU, then the least idle CPU.
`shortest_first` (a queue-order plugin): pending jobs by runtime estimate, shortest first.
Both are pure functions of their arguments, in integers, as the plugin guide asks.
"""

from __future__ import annotations

from collections.abc import Hashable

from gpupool.core.framework import QueueOrderPlugin, ScorePlugin
from gpupool.core.model import JobSpec, TaskShape
from gpupool.core.nodes import NodeKind, NodeState

#: more milli-CPU than any node has: one milli-GPU left outweighs every CPU left
CPU_SCALE = 10**9


class GpuTightScore(ScorePlugin):
    name = "gpu_tight"

    def score(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        gpu_left = state.gpu_idle - shape.total_gpu_milli
        cpu_left = state.cpu_free - shape.cpu_milli
        return -(gpu_left * CPU_SCALE + cpu_left)


class ShortestFirstOrder(QueueOrderPlugin):
    name = "shortest_first"

    def job_key(self, job: JobSpec, now: float) -> tuple[Hashable, ...]:
        estimate = job.estimate_s
        return (estimate is None, estimate or 0.0, job.submitted_at, job.id)
