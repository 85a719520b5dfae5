"""Defaulted builders for tests and plugin authors: describe only what a case is about."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.core.model import DeviceShare, GpuDevice, JobSpec, NodeSpec, TaskShape, TaskSpec
from gpupool.core.nodes import NodeState, NodeTable
from gpupool.core.queues import GPU_UNITS
from gpupool.core.resources import ResourceVector
from gpupool.core.snapshot import RunningTask


def gpu_units(gpus: int) -> ResourceVector:
    """A quota of `gpus` whole GPUs in GPU units (the default unit: 1,000 per GPU)."""
    return ResourceVector({GPU_UNITS: gpus * 1000})


def make_node(name: str = "n1", gpus: int = 2, model: str = "A100", cpu_milli: int = 64_000,
              memory_mib: int = 262_144, gpu_memory_mib: int = 0, untrusted_images: bool = True) -> NodeSpec:
    return NodeSpec(name, cpu_milli, memory_mib, tuple(GpuDevice(i, model, gpu_memory_mib) for i in range(gpus)),
                    untrusted_images=untrusted_images)


def make_shape(gpu_milli: int = 1000, gpu_count: int | None = None, cpu_milli: int = 0, memory_mib: int = 0,
               models: Sequence[str] = (), gpu_memory_mib: int = 0, share_group: str = "",
               image: bool = False) -> TaskShape:
    """`gpu_milli` per GPU; `gpu_count` defaults to 1 when gpu_milli > 0, else 0."""
    count = gpu_count if gpu_count is not None else (1 if gpu_milli else 0)
    return TaskShape(cpu_milli, memory_mib, count, gpu_milli if count else 0, gpu_memory_mib, tuple(models),
                     share_group, image)


def make_job(job_id: str, *shapes: TaskShape, min_tasks: int = 0, queue: str = "default", priority: int = 0,
             submitted_at: float = 0.0, preemptible: bool = True,
             runtime_estimate_s: float | None = None) -> JobSpec:
    tasks = tuple(TaskSpec(f"{job_id}/{i}", s) for i, s in enumerate(shapes or (make_shape(),)))
    return JobSpec(job_id, tasks, queue, min_tasks, priority, submitted_at, preemptible,
                   runtime_estimate_s=runtime_estimate_s)


def table_of(*nodes: NodeSpec | tuple[NodeSpec, Sequence[int]] | tuple[NodeSpec, Sequence[int], int]) -> NodeTable:
    """A table of nodes; a node given as (spec, gpu_free) or (spec, gpu_free, cpu_free) starts in that state."""
    specs = [n if isinstance(n, NodeSpec) else n[0] for n in nodes]
    table = NodeTable(specs)
    for n in nodes:
        if isinstance(n, NodeSpec):
            continue
        i = table.index[n[0].name]
        empty = table.states[i]
        cpu = n[2] if len(n) == 3 else empty.cpu_free
        table.set_state(i, NodeState(cpu, empty.memory_free, tuple(n[1]), empty.gpu_memory_free))
    return table


def run_on(table: NodeTable, running: dict[str, RunningTask], node: str, task_id: str, shape: TaskShape,
           gpus: Sequence[int] = (), preemptible: bool = True, checkpointable: bool = False,
           queue: str = "default", priority: int = 0, started_at: float = 0.0,
           submitted_at: float = 0.0) -> RunningTask:
    """Put a running task on `node` (on GPU indices `gpus`, default the lowest that fit) and into `running`."""
    i = table.index[node]
    state = table.states[i]
    if gpus:
        shares = tuple(DeviceShare(g, shape.gpu_milli, shape.gpu_memory_mib) for g in gpus)
    else:
        fitting = [g for g, free in enumerate(state.gpu_free) if free >= shape.gpu_milli]
        shares = tuple(DeviceShare(g, shape.gpu_milli, shape.gpu_memory_mib) for g in fitting[: shape.gpu_count])
    table.set_state(i, state.take(shape, shares))
    task = RunningTask(task_id, task_id.split("/")[0], node, shape, shares, queue, priority, preemptible,
                       started_at, checkpointable, submitted_at=submitted_at)
    running[task_id] = task
    return task
