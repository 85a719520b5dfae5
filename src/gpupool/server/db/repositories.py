"""Queries and conversions between rows and core values; ORM rows stop here."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.core import GpuDevice, JobSpec, NodeSpec, QueueSpec, QueueTree, ResourceVector, TaskShape, TaskSpec
from gpupool.core.queues import GPU_UNITS, model_resource
from gpupool.core.units import CPU, MEMORY
from gpupool.protocol.api import gpus_to_milli
from gpupool.server.db.models import Allocation, Gpu, Job, Node, QueueRow

OPEN_ALLOCATION_STATES = ("starting", "running", "stopping")


def job_shape(spec: dict[str, Any]) -> TaskShape:
    milli = gpus_to_milli(spec["gpus"])
    count, per_gpu = (1, milli) if 0 < milli < 1000 else (milli // 1000, 1000 if milli else 0)
    return TaskShape(cpu_milli=int(Decimal(spec["cpus"]) * 1000), memory_mib=int(spec["memory_mib"]),
                     gpu_count=count, gpu_milli=per_gpu, gpu_memory_mib=int(spec.get("gpu_memory_mib", 0)),
                     gpu_models=tuple(spec.get("gpu_models", [])))


def job_spec(row: Job) -> JobSpec:
    shape = job_shape(row.spec)
    tasks = tuple(TaskSpec(f"{row.id}/{i}", shape) for i in range(int(row.spec["tasks"])))
    limit = row.spec.get("runtime_limit_s")
    return JobSpec(row.id, tasks, queue=row.queue, min_tasks=int(row.spec.get("min_tasks") or len(tasks)),
                   priority=row.priority, submitted_at=float(row.seq), preemptible=row.preemptible,
                   runtime_limit_s=float(limit) if limit else None, user=row.user_id)


def node_spec(node: Node, gpus: Sequence[Gpu]) -> NodeSpec:
    ordered = sorted(gpus, key=lambda g: g.index)
    devices = tuple(GpuDevice(i, g.model, g.memory_mib, g.uuid) for i, g in enumerate(ordered))
    return NodeSpec(node.name, node.cpu_milli, node.memory_mib, devices, node.site, node.rack)


def resources(raw: dict[str, Any] | None) -> ResourceVector | None:
    if raw is None:
        return None
    amounts: dict[str, int] = {}
    if raw.get("gpus") is not None:
        amounts[GPU_UNITS] = int(Decimal(str(raw["gpus"])) * 1000)
    if raw.get("cpus") is not None:
        amounts[CPU] = int(Decimal(str(raw["cpus"])) * 1000)
    if raw.get("memory_mib") is not None:
        amounts[MEMORY] = int(raw["memory_mib"])
    for model, gpus in (raw.get("per_model") or {}).items():
        amounts[model_resource(model)] = int(Decimal(str(gpus)) * 1000)
    return ResourceVector(amounts)


def queue_tree(session: Session) -> QueueTree:
    rows = session.scalars(select(QueueRow).order_by(QueueRow.name)).all()
    specs = [QueueSpec(r.name, r.parent, resources(r.guaranteed) or ResourceVector(), resources(r.limit),
                       r.over_quota_weight, resources(r.borrow_limit), resources(r.lend_limit), r.priority,
                       r.preempt_min_runtime_s, r.reclaim_min_runtime_s) for r in rows]
    return QueueTree(specs)


def pending_jobs(session: Session, limit: int = 5000) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.state == "pending").order_by(Job.seq).limit(limit)))


def open_allocations(session: Session) -> list[Allocation]:
    return list(session.scalars(select(Allocation).where(Allocation.state.in_(OPEN_ALLOCATION_STATES))))


def nodes_with_gpus(session: Session) -> list[tuple[Node, list[Gpu]]]:
    nodes = session.scalars(select(Node).order_by(Node.name)).all()
    gpus: dict[str, list[Gpu]] = {}
    for gpu in session.scalars(select(Gpu)):
        gpus.setdefault(gpu.node_id, []).append(gpu)
    return [(n, gpus.get(n.id, [])) for n in nodes]
