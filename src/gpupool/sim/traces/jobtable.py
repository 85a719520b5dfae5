"""The generic job table: one job per row, the format any cluster trace can be written in (docs: Trace files).

Columns (a header names them; order free; unknown columns such as `state` are ignored):

* `job_id` (required): unique, non-empty.
* `tenant`: who submitted it (a Philly VC, an Alibaba app); becomes the job's queue (see `tenant_tree`).
* `submit_time` (required column): when the job was submitted. Whole seconds on the trace clock, or an ISO-8601
  UTC time (`2017-10-02T10:30:41Z`, `2017-10-02 10:30:41`). One file uses one of the two. Empty: the job was
  already there when the trace began (it is submitted at the trace's start).
* `start_time`, `end_time`: the same clock. The duration is `duration_s` if given, else `end - start`, else
  `end - submit`; an empty end means the job still ran when the trace ended (it runs to the trace's end, the
  latest time in the file).
* `duration_s`: seconds of run time (whole, at least 1).
* `gpus` (required): the job's GPUs, whole (`8`) or a fraction of one GPU (`0.5`).
* `gang`: tasks of the job (default: whole GPUs in tasks of at most 8); each asks `gpus / gang`.
* `cpus` (cores, may be fractional), `memory_mib`, `gpu_model` (acceptable models, `|`-separated), `priority`
  (whole, higher first), `runtime_limit_s`, `user`: per job, divided evenly across its tasks for cpus and memory.

The `_utc` spelling of the three times (`submit_time_utc`, as in `../shared/traces/tenant-demand/`) is read as the
same column. Times stay on the trace's clock (an ISO time becomes Unix seconds); the file may span at most
`MAX_TIME_S`. A row that breaks the format
raises `TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TypeVar

from gpupool.core.model import TaskShape
from gpupool.core.units import MILLI
from gpupool.sim.traces.bounds import (
    MAX_CPU_MILLI,
    MAX_GANG,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
    MAX_PODS,
    MAX_TASKS,
    MAX_TIME_S,
    csv_rows,
    name,
    whole,
)
from gpupool.sim.traces.errors import TraceError, shown
from gpupool.sim.traces.openb import Pod, read_pods

REQUIRED = ("job_id", "submit_time", "gpus")
ALIASES = {"submit_time_utc": "submit_time", "start_time_utc": "start_time", "end_time_utc": "end_time"}
#: whole GPUs per task when a row gives no gang size: a larger job is a gang of tasks of at most this many
GPUS_PER_TASK = 8
MAX_JOB_GPUS = MAX_GANG * MAX_GPUS_PER_NODE
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    fields: dict[str, str]
    times: dict[str, int | None]


def is_job_table(path: str | Path) -> bool:
    """Whether the CSV's header names a `job_id` column (a job table, not an openb pod list)."""
    with Path(path).open("rb") as handle:
        first = handle.readline(4096).decode(errors="replace")
    return "job_id" in [c.strip() for c in first.strip().split(",")]


def _parse(path: Path, line: int, column: str, text: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(text)
    except ValueError as exc:
        raise TraceError(str(path), line, column, str(exc)) from None


def parse_time(text: str) -> tuple[int, str]:
    """(epoch-like whole seconds, "s" or "iso") of a time cell."""
    text = text.strip()
    if text.lstrip("+-").isdigit():
        return whole(0, 1 << 40)(text), "s"
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{shown(text)} is neither whole seconds nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp()), "iso"


def _decimal(low: Decimal, high: Decimal) -> Callable[[str], Decimal]:
    def parse(text: str) -> Decimal:
        try:
            value = Decimal(text.strip())
        except InvalidOperation:
            raise ValueError(f"{shown(text)} is not a number") from None
        if not value.is_finite() or not low <= value <= high:
            raise ValueError(f"{shown(text)} is not within {low}..{high}")
        return value
    return parse


def _rows(path: Path) -> list[_Row]:
    """Every row with its times read (None: empty), all in one format."""
    rows: list[_Row] = []
    formats: set[str] = set()
    for line, raw in csv_rows(path, (), MAX_PODS):
        fields = {ALIASES.get(k.strip(), k.strip()): v for k, v in raw.items()}
        if not rows:
            missing = [c for c in REQUIRED if c not in fields]
            if missing:
                raise TraceError(str(path), 1, missing[0], "required column missing")
        times: dict[str, int | None] = {}
        for column in ("submit_time", "start_time", "end_time"):
            text = fields.get(column, "").strip()
            if not text:
                times[column] = None
                continue
            times[column], kind = _parse(path, line, column, text, parse_time)
            formats.add(kind)
            if len(formats) > 1:
                raise TraceError(str(path), line, column, "mixes whole seconds and ISO-8601 times in one file")
        rows.append(_Row(line, fields, times))
    if not rows:
        raise TraceError(str(path), 1, "-", "no jobs")
    return rows


def _clock(path: Path, rows: list[_Row]) -> tuple[int, int]:
    """(start, end) of the trace: its earliest and latest time; TraceError if it spans more than MAX_TIME_S."""
    present = [(t, r.line) for r in rows for t in r.times.values() if t is not None]
    if not present:
        raise TraceError(str(path), rows[0].line, "submit_time", "no row has any time")
    start, end = min(present)[0], max(present)
    if end[0] - start > MAX_TIME_S:
        raise TraceError(str(path), end[1], "end_time", f"the trace spans more than {MAX_TIME_S} seconds")
    return start, end[0]


def read_jobs(path: str | Path) -> list[Pod]:
    """The jobs of a job table as pods (one per row, in file order), times in whole seconds on the trace clock."""
    path = Path(path)
    rows = _rows(path)
    start, end = _clock(path, rows)
    pods, names, tasks = [], set(), 0
    shapes: dict[TaskShape, TaskShape] = {}
    for row in rows:
        pod = _pod(path, row, start, end)
        if pod.name in names:
            raise TraceError(str(path), row.line, "job_id", f"{shown(pod.name)}: must be unique")
        names.add(pod.name)
        shape = shapes.setdefault(pod.shape, pod.shape)  # equal shapes share one object, as in `read_pods`
        pods.append(pod if shape is pod.shape else replace(pod, shape=shape))
        tasks += pod.gang
        if tasks > MAX_TASKS:
            raise TraceError(str(path), row.line, "gang", f"the jobs so far add up to more than {MAX_TASKS} tasks")
    return pods


def _pod(path: Path, row: _Row, start: int, end: int) -> Pod:
    f, line, t = row.fields, row.line, row.times
    job_id = f["job_id"].strip()
    if not job_id:
        raise TraceError(str(path), line, "job_id", "must not be empty")
    submit = start if t["submit_time"] is None else t["submit_time"]
    begin = t["start_time"] if t["start_time"] is not None else submit
    if begin < submit:
        raise TraceError(str(path), line, "start_time", "is before submit_time")
    duration = _duration(path, row, begin, end)
    gang, shape = _shape(path, row)
    text = {c: f.get(c, "").strip() for c in ("tenant", "priority", "runtime_limit_s", "user")}
    return Pod(
        name=job_id, shape=shape, phase="Succeeded", creation_time=submit,
        scheduled_time=t["start_time"], deletion_time=begin + duration,
        queue=_parse(path, line, "tenant", text["tenant"], name) if text["tenant"] else "",
        user=text["user"], gang=gang, line=line,
        runtime_limit_s=_parse(path, line, "runtime_limit_s", text["runtime_limit_s"], whole(1, MAX_TIME_S))
        if text["runtime_limit_s"] else None,
        priority=_parse(path, line, "priority", text["priority"], whole(-10**6, 10**6)) if text["priority"] else None,
    )


def _duration(path: Path, row: _Row, begin: int, end: int) -> int:
    text = row.fields.get("duration_s", "").strip()
    if text:
        return _parse(path, row.line, "duration_s", text, whole(1, MAX_TIME_S))
    finish = row.times["end_time"]
    if finish is not None and finish < begin:
        raise TraceError(str(path), row.line, "end_time", "is before the job's start (or submit) time")
    return max(1, (end if finish is None else finish) - begin)


def _shape(path: Path, row: _Row) -> tuple[int, TaskShape]:
    """(tasks, each task's shape) of a row: its GPUs, split into a gang as the row or GPUS_PER_TASK says."""
    f, line = row.fields, row.line
    gpus = _parse(path, line, "gpus", f["gpus"], _decimal(Decimal("0.001"), Decimal(MAX_JOB_GPUS)))
    if gpus > 1 and gpus != gpus.to_integral_value():
        raise TraceError(str(path), line, "gpus", f"{shown(f['gpus'])}: above 1 GPU, GPUs are whole")
    milli = int(gpus * MILLI)
    if milli != gpus * MILLI:
        raise TraceError(str(path), line, "gpus", f"{shown(f['gpus'])}: at most 3 decimals (milli-GPU)")
    gang_text = f.get("gang", "").strip()
    gang = _parse(path, line, "gang", gang_text, whole(1, MAX_GANG)) if gang_text else -(-int(gpus) // GPUS_PER_TASK)
    gang = max(1, gang)
    if milli % gang or (milli // gang > MILLI and (milli // gang) % MILLI):
        raise TraceError(str(path), line, "gang", f"{gpus} GPUs do not split evenly into {gang} tasks of whole GPUs")
    per_task = milli // gang
    cpus = _parse(path, line, "cpus", f.get("cpus", "").strip() or "0",
                  _decimal(Decimal(0), Decimal(MAX_CPU_MILLI) / MILLI))
    memory = _parse(path, line, "memory_mib", f.get("memory_mib", "").strip() or "0", whole(0, MAX_MEMORY_MIB))
    try:
        models = tuple(name(m.strip()) for m in f.get("gpu_model", "").split("|") if m.strip())
    except ValueError as exc:
        raise TraceError(str(path), line, "gpu_model", str(exc)) from None
    count, each = (1, per_task) if per_task < MILLI else (per_task // MILLI, MILLI)
    if count > MAX_GPUS_PER_NODE:
        raise TraceError(str(path), line, "gang", f"a task of {count} GPUs: at most {MAX_GPUS_PER_NODE} per task")
    return gang, TaskShape(cpu_milli=int(cpus * MILLI) // gang, memory_mib=memory // gang, gpu_count=count,
                           gpu_milli=each, gpu_models=models)


def read_workload(path: str | Path) -> list[Pod]:
    """The jobs of a trace file: a job table (its header names `job_id`) or an openb pod list."""
    return read_jobs(path) if is_job_table(path) else read_pods(path)
