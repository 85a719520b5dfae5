"""Tenants in the simulator: the queue file, assigning trace jobs to leaf queues, and per-queue meters.

Queue file (YAML)::

    gpu_units: {H100: 2000, T4: 250}     # optional: milli-units per GPU of a model (default 1000)
    queues:
      - name: org
        guaranteed: {gpus: 64}            # gpus may be fractional ("0.5"); also cpus, memory_mib, gpus:<model>
        limit: {gpus: 128}
      - name: team-a
        parent: org
        guaranteed: {gpus: "16.5"}
        over_quota_weight: 2
        borrow_limit: {gpus: 8}
        lend_limit: {gpus: 4}
        priority: 0
        preempt_min_runtime_s: 600
        reclaim_min_runtime_s: 600

Errors name the file, line and field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupool.core import QueueSpec, QueueTree, ResourceVector
from gpupool.core.queues import GPU_UNITS, model_resource
from gpupool.core.units import CPU, MEMORY, parse_milli
from gpupool.sim.traces.errors import TraceError

QUEUE_FIELDS = {"name", "parent", "guaranteed", "limit", "over_quota_weight", "borrow_limit", "lend_limit",
                "priority", "preempt_min_runtime_s", "reclaim_min_runtime_s"}


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records the line of every mapping under the key "__line__"."""


def _mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


def _resources(path: str, line: int, field: str, raw: Any) -> ResourceVector:
    if not isinstance(raw, dict):
        raise TraceError(path, line, field, "must be a mapping like {gpus: 8}")
    amounts: dict[str, int] = {}
    for key, value in raw.items():
        if key == "__line__":
            continue
        try:
            if key == "gpus":
                amounts[GPU_UNITS] = parse_milli(value, field=f"{field}.gpus")
            elif key.startswith("gpus:"):
                amounts[model_resource(key.removeprefix("gpus:"))] = parse_milli(value, field=f"{field}.{key}")
            elif key == "cpus":
                amounts[CPU] = parse_milli(value, field=f"{field}.cpus")
            elif key == "memory_mib":
                amounts[MEMORY] = int(value)
            else:
                raise ValueError(f"{field}.{key}: unknown resource (use gpus, gpus:<model>, cpus, memory_mib)")
        except (ValueError, TypeError) as exc:
            raise TraceError(path, line, f"{field}.{key}", str(exc)) from None
    return ResourceVector(amounts)


def _queue(path: str, raw: Any) -> QueueSpec:
    if not isinstance(raw, dict):
        raise TraceError(path, 0, "queues", "each queue must be a mapping")
    line = raw.get("__line__", 0)
    unknown = set(raw) - QUEUE_FIELDS - {"__line__"}
    if unknown:
        raise TraceError(path, line, sorted(unknown)[0], f"unknown field; known: {', '.join(sorted(QUEUE_FIELDS))}")
    optional = {k: _resources(path, line, k, raw[k]) for k in ("limit", "borrow_limit", "lend_limit") if k in raw}
    try:
        return QueueSpec(
            name=str(raw.get("name", "")), parent=raw.get("parent"),
            guaranteed=_resources(path, line, "guaranteed", raw.get("guaranteed", {})), **optional,
            over_quota_weight=int(raw.get("over_quota_weight", 1)), priority=int(raw.get("priority", 0)),
            preempt_min_runtime_s=float(raw.get("preempt_min_runtime_s", 0)),
            reclaim_min_runtime_s=float(raw.get("reclaim_min_runtime_s", 0)))
    except (ValueError, TypeError) as exc:
        raise TraceError(path, line, "queue", str(exc)) from None


def load_queues(path: str | Path) -> QueueTree:
    """Parse and validate a queue file."""
    text = Path(path).read_text()
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TraceError(str(path), mark.line + 1 if mark else 0, "-", f"not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("queues"), list) or not data["queues"]:
        raise TraceError(str(path), 1, "queues", "the file needs a non-empty list 'queues'")
    units = data.get("gpu_units", {}) or {}
    specs = [_queue(str(path), q) for q in data["queues"]]
    try:
        return QueueTree(specs, {str(k): parse_milli(v, field=f"gpu_units.{k}") for k, v in units.items()
                                 if k != "__line__"})
    except ValueError as exc:
        raise TraceError(str(path), 1, "queues", str(exc)) from None


def assign_by_hash(name: str, leaves: Sequence[str]) -> str:
    """A stable leaf for a job name: sha256(name) modulo the number of leaves (sorted by name)."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return sorted(leaves)[digest % len(leaves)]


def usage_units(usage: Mapping[str, ResourceVector]) -> dict[str, int]:
    return {q: v[GPU_UNITS] for q, v in usage.items()}
