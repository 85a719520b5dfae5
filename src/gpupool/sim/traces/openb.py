"""Readers for the Alibaba GPU cluster trace v2023 ("openb") node and pod CSVs.

Columns and units are those of the trace's README. Every row is validated; the first bad value
raises `TraceError` naming the file, the line (1 = header) and the column.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpupool.core.model import GpuDevice, NodeSpec, TaskShape
from gpupool.sim.traces.errors import TraceError

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
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


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(str(path), 1, "-", "file is empty")
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(str(path), 1, missing[0], f"required column missing (header: {','.join(header)})")
        for row in reader:
            line = reader.line_num
            if len(row) != len(header):
                raise TraceError(str(path), line, "-", f"expected {len(header)} fields, found {len(row)}")
            yield line, dict(zip(header, row, strict=True))


def _field(path: Path, line: int, row: dict[str, str], column: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(row[column])
    except (ValueError, KeyError) as exc:
        raise TraceError(str(path), line, column, f"{row.get(column, '')!r}: {exc}") from None


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _optional_time(text: str) -> int | None:
    return _count(text) if text.strip() else None


def read_nodes(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        gpus = _field(path, line, row, "gpu", _count)
        model = row["model"].strip()
        if gpus and not model:
            raise TraceError(str(path), line, "model", "a node with GPUs needs a model")
        nodes.append(NodeSpec(
            name=_field(path, line, row, "sn", lambda s: s.strip() or _fail("must not be empty")),
            cpu_milli=_field(path, line, row, "cpu_milli", _count),
            memory_mib=_field(path, line, row, "memory_mib", _count),
            gpus=tuple(GpuDevice(i, model) for i in range(gpus)),
        ))
    if not nodes:
        raise TraceError(str(path), 1, "-", "no nodes")
    return nodes


def _fail(message: str) -> str:
    raise ValueError(message)


def _shape(path: Path, line: int, row: dict[str, str]) -> TaskShape:
    spec = row.get("gpu_spec", "").strip()
    try:
        return TaskShape(
            cpu_milli=_field(path, line, row, "cpu_milli", _count),
            memory_mib=_field(path, line, row, "memory_mib", _count),
            gpu_count=_field(path, line, row, "num_gpu", _count),
            gpu_milli=_field(path, line, row, "gpu_milli", _count),
            gpu_models=tuple(m for m in spec.split("|") if m) if spec else (),
        )
    except ValueError as exc:
        if isinstance(exc, TraceError):
            raise
        column = str(exc).split(":", 1)[0]
        column = {"gpu_count": "num_gpu"}.get(column, column)
        raise TraceError(str(path), line, column, str(exc)) from None


def read_pods(path: str | Path) -> list[Pod]:
    """The pods of a trace, in file order. Pods of equal shape share one `TaskShape` object (a trace of thousands
    of pods has about a hundred shapes), so the scheduler's many lookups by shape find it by identity instead of
    comparing it field by field."""
    path = Path(path)
    pods: list[Pod] = []
    names: set[str] = set()
    shapes: dict[TaskShape, TaskShape] = {}
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        if not name or name in names:
            raise TraceError(str(path), line, "name", f"{name!r}: must be non-empty and unique")
        names.add(name)
        pods.append(Pod(
            name=name,
            shape=shapes.setdefault(shape := _shape(path, line, row), shape),
            qos=row.get("qos", ""),
            phase=row.get("pod_phase", ""),
            creation_time=_field(path, line, row, "creation_time", _optional_time) if "creation_time" in row else None,
            deletion_time=_field(path, line, row, "deletion_time", _optional_time) if "deletion_time" in row else None,
            scheduled_time=(_field(path, line, row, "scheduled_time", _optional_time)
                            if "scheduled_time" in row else None),
            queue=row.get("queue", "").strip(), user=row.get("user", "").strip(),
            gang=_field(path, line, row, "gang", _positive) if row.get("gang", "").strip() else 1,
            runtime_limit_s=(_field(path, line, row, "runtime_limit_s", _optional_time)
                             if "runtime_limit_s" in row else None),
        ))
    return pods


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
                raise TraceError(str(path), line, column, "time-based replay needs this column")
        if pod.deletion_time < pod.creation_time:  # type: ignore[operator]
            raise TraceError(str(path), line, "deletion_time", "is before creation_time")
