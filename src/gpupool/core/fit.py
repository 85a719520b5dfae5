"""Which GPUs of a node can take a task, and whether the node can take it at all."""

from __future__ import annotations

from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.units import MILLI


def fitting_gpus(state: NodeState, shape: TaskShape) -> list[int]:
    """GPU indices (ascending) that can take one GPU's worth of `shape`.

    A whole GPU must be entirely free; a fraction needs `gpu_milli` and `gpu_memory_mib` free.
    """
    if shape.gpu_milli >= MILLI:
        return [g for g, free in enumerate(state.gpu_free) if free >= MILLI]
    need_mem = shape.gpu_memory_mib
    return [
        g
        for g, free in enumerate(state.gpu_free)
        if free >= shape.gpu_milli and state.gpu_memory_free[g] >= need_mem
    ]


def node_fits(kind: NodeKind, state: NodeState, shape: TaskShape) -> str:
    """"" when the node can take the task, else the first reason it cannot (a stable phrase)."""
    if not state.schedulable:
        return "node unschedulable"
    if shape.gpu_count and not shape.allows_model(kind.model):
        return "GPU model not allowed"
    if shape.gpu_count > kind.gpu_count:
        return "too few GPUs on node"
    if state.cpu_free < shape.cpu_milli:
        return "insufficient CPU"
    if state.memory_free < shape.memory_mib:
        return "insufficient memory"
    if shape.gpu_count and len(fitting_gpus(state, shape)) < shape.gpu_count:
        return "insufficient GPU"
    return ""


def whole_gpu_shares(state: NodeState, shape: TaskShape, gpus: list[int]) -> tuple[DeviceShare, ...]:
    """Shares for whole GPUs: each takes all of its device's free milli and memory."""
    return tuple(DeviceShare(g, state.gpu_free[g], state.gpu_memory_free[g]) for g in gpus[: shape.gpu_count])


def lowest_whole_gpus(state: NodeState, shape: TaskShape) -> tuple[DeviceShare, ...]:
    """The `gpu_count` lowest-index fully free GPUs (the rule every policy uses for whole GPUs)."""
    return whole_gpu_shares(state, shape, fitting_gpus(state, shape))


def fraction_share(shape: TaskShape, gpu: int) -> tuple[DeviceShare, ...]:
    return (DeviceShare(gpu, shape.gpu_milli, shape.gpu_memory_mib),)


def copies_fit(kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
    """How many tasks of `shape` the node could take at once (ignoring whether it is schedulable)."""
    if shape.gpu_count and (not shape.allows_model(kind.model) or shape.gpu_count > kind.gpu_count):
        return 0
    limits = []
    if shape.cpu_milli:
        limits.append(state.cpu_free // shape.cpu_milli)
    if shape.memory_mib:
        limits.append(state.memory_free // shape.memory_mib)
    if shape.is_shared:
        limits.append(sum(free // shape.gpu_milli for free in state.gpu_free))
    elif shape.gpu_count:
        limits.append(sum(1 for free in state.gpu_free if free >= MILLI) // shape.gpu_count)
    return min(limits) if limits else 64
