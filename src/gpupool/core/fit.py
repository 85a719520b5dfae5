"""Which GPUs of a node can take a task, and whether the node can take it at all."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState
from gpupool.core.units import MILLI


def fitting_gpus(state: NodeState, shape: TaskShape) -> list[int]:
    """GPU indices (ascending) that can take one GPU's worth of `shape`.

    A whole GPU must be entirely free; a fraction needs `gpu_milli` and `gpu_memory_mib` free, on a GPU that is
    free or shared within the fraction's own group.
    """
    if shape.gpu_milli >= MILLI:
        return [g for g, free in enumerate(state.gpu_free) if free >= MILLI]
    need_mem = shape.gpu_memory_mib
    fits = [
        g
        for g, free in enumerate(state.gpu_free)
        if free >= shape.gpu_milli and state.gpu_memory_free[g] >= need_mem
    ]
    if state.gpu_groups or shape.share_group:
        return [g for g in fits if state.gpu_free[g] >= MILLI or state.group_of(g) == shape.share_group]
    return fits


def _gpu_shortage(state: NodeState, shape: TaskShape) -> str:
    """Why too few GPUs fit `shape`: a fraction that would fit but for other groups' sharing says so."""
    if shape.is_shared and (state.gpu_groups or shape.share_group):
        free = any(f >= shape.gpu_milli and state.gpu_memory_free[g] >= shape.gpu_memory_mib
                   for g, f in enumerate(state.gpu_free))
        if free:
            return "GPU shared by another group"
    return "insufficient GPU"


def node_fits(kind: NodeKind, state: NodeState, shape: TaskShape) -> str:
    """"" when the node can take the task, else the first reason it cannot (a stable phrase)."""
    if not state.schedulable:
        return "node unschedulable"
    if shape.has_image and not kind.untrusted_images:
        return "node refuses untrusted images"
    if not shape.allows_labels(kind.labels):
        return "node constraints not met"
    if shape.gpu_count and not shape.allows_model(kind.model):
        return "GPU model not allowed"
    if shape.gpu_count > kind.gpu_count:
        return "too few GPUs on node"
    if state.cpu_free < shape.cpu_milli:
        return "insufficient CPU"
    if state.memory_free < shape.memory_mib:
        return "insufficient memory"
    if shape.gpu_count and len(fitting_gpus(state, shape)) < shape.gpu_count:
        return _gpu_shortage(state, shape)
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
    if (shape.has_image and not kind.untrusted_images) or not shape.allows_labels(kind.labels):
        return 0
    if shape.gpu_count and (not shape.allows_model(kind.model) or shape.gpu_count > kind.gpu_count):
        return 0
    limits = []
    if shape.cpu_milli:
        limits.append(state.cpu_free // shape.cpu_milli)
    if shape.memory_mib:
        limits.append(state.memory_free // shape.memory_mib)
    if shape.is_shared:
        limits.append(sum(state.gpu_free[g] // shape.gpu_milli for g in fitting_gpus(state, shape)))
    elif shape.gpu_count:
        limits.append(sum(1 for free in state.gpu_free if free >= MILLI) // shape.gpu_count)
    return min(limits) if limits else 64


def without(state: NodeState, released: Iterable[tuple[TaskShape, Sequence[DeviceShare]]]) -> NodeState:
    """The node's state once the tasks of `released` (shape, shares) are gone, for questions of fit only: in one
    pass, without the checks of `NodeState.give` and without placement tags; a GPU free again leaves its group."""
    gpu, gmem = list(state.gpu_free), list(state.gpu_memory_free)
    cpu, mem = state.cpu_free, state.memory_free
    for shape, shares in released:
        cpu += shape.cpu_milli
        mem += shape.memory_mib
        for share in shares:
            gpu[share.index] += share.milli
            gmem[share.index] += share.memory_mib
    groups = state.gpu_groups
    if groups:
        groups = tuple("" if gpu[g] >= MILLI else group for g, group in enumerate(groups))
        groups = groups if any(groups) else ()
    return NodeState(cpu, mem, tuple(gpu), tuple(gmem), (), state.schedulable, groups)
