"""Readers for the Alibaba GPU cluster trace v2023 ("openb") node and pod CSVs.

Columns and units are those of the trace's README. Every row is validated within the bounds of `bounds`; the first
bad value raises `TraceError` naming the file, the line (1 = header) and the column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpupool.core.model import GpuDevice, NodeSpec, TaskShape
from gpupool.core.units import MILLI
from gpupool.sim.traces.bounds import (
    MAX_CPU_MILLI,
    MAX_GANG,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
    MAX_NODES,
    MAX_PODS,
    MAX_TASKS,
    MAX_TIME_S,
    csv_rows,
    name,
    whole,
)
from gpupool.sim.traces.errors import TraceError, shown

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
#: columns of seconds on the trace clock, each empty or a whole number in [0, MAX_TIME_S]
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time", "runtime_limit_s")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pod:
    """One row of an openb pod list. Times are seconds on the trace clock (None when absent)."""

    name: str
    shape: TaskShape
    qos: str = ""
    phase: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None
    #: optional columns of gpupool's own workloads (`gpupool sim generate`): tenant, gang size, limit
    queue: str = ""
    user: str = ""
    gang: int = 1
    runtime_limit_s: float | None = None
    #: the job's priority (higher first; None: from `qos`)
    priority: int | None = None
    #: the line of the pod list the pod ends on (0: not read from a file)
    line: int = field(default=0, compare=False)


def _field(path: Path, line: int, row: dict[str, str], column: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(row[column])
    except (ValueError, KeyError) as exc:
        raise TraceError(str(path), line, column, str(exc)) from None


_cpu = whole(0, MAX_CPU_MILLI)
_memory = whole(0, MAX_MEMORY_MIB)
_gpus = whole(0, MAX_GPUS_PER_NODE)
_gpu_milli = whole(0, MILLI)
_time = whole(0, MAX_TIME_S)
_gang = whole(1, MAX_GANG)


def _optional_time(text: str) -> int | None:
    return _time(text) if text.strip() else None


def read_nodes(path: str | Path) -> list[NodeSpec]:
    """The nodes of a node list, in file order (at most MAX_NODES, each with at most MAX_GPUS_PER_NODE GPUs)."""
    path = Path(path)
    nodes = []
    for line, row in csv_rows(path, NODE_COLUMNS, MAX_NODES):
        gpus = _field(path, line, row, "gpu", _gpus)
        model = _field(path, line, row, "model", _model) if gpus else row["model"].strip()
        nodes.append(NodeSpec(
            name=_field(path, line, row, "sn", _non_empty),
            cpu_milli=_field(path, line, row, "cpu_milli", _cpu),
            memory_mib=_field(path, line, row, "memory_mib", _memory),
            gpus=tuple(GpuDevice(i, model) for i in range(gpus)),
        ))
    if not nodes:
        raise TraceError(str(path), 1, "-", "no nodes")
    return nodes


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _model(text: str) -> str:
    if not text.strip():
        raise ValueError("a node with GPUs needs a model")
    return name(text.strip())


def _models(text: str) -> tuple[str, ...]:
    return tuple(name(m) for m in text.strip().split("|") if m)


def _shape(path: Path, line: int, row: dict[str, str]) -> TaskShape:
    try:
        return TaskShape(
            cpu_milli=_field(path, line, row, "cpu_milli", _cpu),
            memory_mib=_field(path, line, row, "memory_mib", _memory),
            gpu_count=_field(path, line, row, "num_gpu", _gpus),
            gpu_milli=_field(path, line, row, "gpu_milli", _gpu_milli),
            gpu_models=_field(path, line, row, "gpu_spec", _models) if "gpu_spec" in row else (),
        )
    except ValueError as exc:
        if isinstance(exc, TraceError):
            raise
        column = str(exc).split(":", 1)[0]
        column = {"gpu_count": "num_gpu"}.get(column, column)
        raise TraceError(str(path), line, column, str(exc)) from None


def read_pods(path: str | Path) -> list[Pod]:
    """The pods of a trace, in file order (at least one; at most MAX_PODS, of MAX_TASKS tasks in all). Pods of
    equal shape share one `TaskShape` object (a trace of thousands of pods has about a hundred shapes), so the
    scheduler's many lookups by shape find it by identity instead of comparing it field by field."""
    path = Path(path)
    pods: list[Pod] = []
    names: set[str] = set()
    shapes: dict[TaskShape, TaskShape] = {}
    tasks = 0
    for line, row in csv_rows(path, POD_COLUMNS, MAX_PODS):
        pod_name = row["name"].strip()
        if not pod_name or pod_name in names:
            raise TraceError(str(path), line, "name", f"{shown(pod_name)}: must be non-empty and unique")
        names.add(pod_name)
        pods.append(Pod(
            name=pod_name,
            shape=shapes.setdefault(shape := _shape(path, line, row), shape),
            qos=row.get("qos", ""),
            phase=row.get("pod_phase", ""),
            **{column: _field(path, line, row, column, _optional_time) for column in TIME_COLUMNS if column in row},
            queue=_field(path, line, row, "queue", _queue) if "queue" in row else "",
            user=row.get("user", "").strip(),
            gang=_field(path, line, row, "gang", _gang) if row.get("gang", "").strip() else 1,
            line=line,
        ))
        tasks += pods[-1].gang
        if tasks > MAX_TASKS:
            raise TraceError(str(path), line, "gang", f"the gangs so far add up to more than {MAX_TASKS} tasks")
    if not pods:
        raise TraceError(str(path), 1, "-", "no pods")
    return pods


def _queue(text: str) -> str:
    return name(text.strip()) if text.strip() else ""


def pod_duration(pod: Pod) -> int:
    """How long a pod ran in the trace: deletion - scheduled (or - creation if never scheduled), >= 1 s."""
    assert pod.creation_time is not None and pod.deletion_time is not None
    begin = pod.scheduled_time if pod.scheduled_time is not None else pod.creation_time
    return max(1, pod.deletion_time - begin)


def require_times(path: str | Path, pods: list[Pod]) -> None:
    """Raise TraceError unless every pod has creation and deletion times (time-based replay needs them)."""
    for line, pod in enumerate(pods, start=2):
        for column in ("creation_time", "deletion_time"):
            if getattr(pod, column) is None:
                raise TraceError(str(path), pod.line or line, column, "time-based replay needs this column")
        if pod.deletion_time < pod.creation_time:  # type: ignore[operator]
            raise TraceError(str(path), pod.line or line, "deletion_time", "is before creation_time")
