"""Filter: the node has the CPU, memory, GPU model and free GPUs (or GPU fraction, free or shared within the
task's group) the task needs, takes untrusted images if the task runs one, and has the constraint tags it asks."""

from __future__ import annotations

from gpupool.core.fit import node_fits
from gpupool.core.framework import OK, Code, FilterPlugin, Status
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeKind, NodeState

_UNRESOLVABLE = ("GPU model not allowed", "too few GPUs on node", "node unschedulable",
                 "node refuses untrusted images",
                 "node constraints not met")


class GpuFitFilter(FilterPlugin):
    name = "gpu_fit"

    def __init__(self) -> None:
        self._statuses: dict[str, Status] = {}

    def filter(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> Status:
        reason = node_fits(kind, state, shape)
        if not reason:
            return OK
        status = self._statuses.get(reason)
        if status is None:
            code = Code.UNRESOLVABLE if reason in _UNRESOLVABLE else Code.UNSCHEDULABLE
            status = self._statuses[reason] = Status(code, reason, self.name)
        return status
