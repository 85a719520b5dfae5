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

Errors name the file, line and field. The file is untrusted input (see `traces.bounds`): at most 1 MiB and 1,000
queues; names start with a letter or digit; amounts at most 10^9 GPUs or CPUs, weights 10^6, priorities +-10^6, min
runtimes ten years.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from gpupool.core import NodeSpec, QueueSpec, QueueTree, ResourceVector
from gpupool.core.queues import DEFAULT_UNIT, GPU_UNITS, model_resource
from gpupool.core.units import CPU, MEMORY, parse_milli
from gpupool.sim.traces.bounds import MAX_MEMORY_MIB, MAX_TIME_S, check_size, name, whole
from gpupool.sim.traces.errors import TraceError, shown

QUEUE_FIELDS = {"name", "parent", "guaranteed", "limit", "over_quota_weight", "borrow_limit", "lend_limit",
                "priority", "preempt_min_runtime_s", "reclaim_min_runtime_s"}
MAX_FILE_BYTES = 1 << 20
MAX_QUEUES = 1000
#: GPUs or CPUs in one guarantee or limit; a weight; a priority either way
MAX_AMOUNT = 10**9
MAX_WEIGHT = 10**6
MAX_PRIORITY = 10**6
#: characters of a YAML integer: a longer one would cost a long conversion for a value no bound admits
MAX_INT_CHARS = 32


class _LineLoader(yaml.SafeLoader):
    """A safe loader that records the line of every mapping under the key "__line__", of every sequence item in
    the list's `lines`, and refuses integers of more than MAX_INT_CHARS characters."""


class _Lines(list[Any]):
    """A YAML sequence, with the line each item starts on."""

    lines: list[int]


def _mapping_with_line(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


def _sequence_with_lines(loader: _LineLoader, node: yaml.SequenceNode) -> _Lines:
    items = _Lines(loader.construct_sequence(node, deep=True))
    items.lines = [item.start_mark.line + 1 for item in node.value]
    return items


def _bounded_int(loader: _LineLoader, node: yaml.ScalarNode) -> int:
    if len(node.value) > MAX_INT_CHARS:
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {len(node.value)} characters",
                                                node.start_mark)
    return int(loader.construct_yaml_int(node))


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence_with_lines)
_LineLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def _milli(value: Any, field: str) -> int:
    """An amount of GPUs or CPUs ("0.5", 8) in milli-units, at most MAX_AMOUNT whole units."""
    text = str(value).strip()
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{field}: {shown(text)} is not a number") from None
    if number.is_finite() and number.copy_abs() > MAX_AMOUNT:  # parse_milli would build an integer of any size
        raise ValueError(f"{field}: {shown(text)} is above the maximum {MAX_AMOUNT}")
    return parse_milli(text, field=field)


def _resources(path: str, line: int, field: str, raw: Any) -> ResourceVector:
    if not isinstance(raw, dict):
        raise TraceError(path, line, field, "must be a mapping like {gpus: 8}")
    amounts: dict[str, int] = {}
    for key, value in raw.items():
        key = str(key)
        if key == "__line__":
            continue
        try:
            if key == "gpus":
                amounts[GPU_UNITS] = _milli(value, f"{field}.gpus")
            elif key.startswith("gpus:"):
                amounts[model_resource(name(key.removeprefix("gpus:")))] = _milli(value, f"{field}.{key}")
            elif key == "cpus":
                amounts[CPU] = _milli(value, f"{field}.cpus")
            elif key == "memory_mib":
                amounts[MEMORY] = whole(0, MAX_MEMORY_MIB)(str(value))
            else:
                raise ValueError(f"{field}.{key}: unknown resource (use gpus, gpus:<model>, cpus, memory_mib)")
        except (ValueError, TypeError) as exc:
            raise TraceError(path, line, f"{field}.{key}", str(exc)) from None
    return ResourceVector(amounts)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{shown(text)} is not a number of seconds") from None
    if not 0 <= value <= MAX_TIME_S:
        raise ValueError(f"{shown(text)} is not within 0..{MAX_TIME_S} seconds")
    return value


#: each scalar field of a queue and its parser (of the value's text)
_SCALARS = {"name": name, "parent": name, "over_quota_weight": whole(0, MAX_WEIGHT),
            "priority": whole(-MAX_PRIORITY, MAX_PRIORITY), "preempt_min_runtime_s": _seconds,
            "reclaim_min_runtime_s": _seconds}


def _queue(path: str, line: int, raw: Any) -> QueueSpec:
    if not isinstance(raw, dict):
        raise TraceError(path, line, "queues", "each queue must be a mapping")
    line = raw.get("__line__", line)
    unknown = {str(k) for k in raw} - QUEUE_FIELDS - {"__line__"}
    if unknown:
        raise TraceError(path, line, sorted(unknown)[0], f"unknown field; known: {', '.join(sorted(QUEUE_FIELDS))}")
    scalars: dict[str, Any] = {}
    for field, parse in _SCALARS.items():
        if raw.get(field) is not None:
            try:
                scalars[field] = parse(str(raw[field]))
            except ValueError as exc:
                raise TraceError(path, line, field, str(exc)) from None
    resources = {k: _resources(path, line, k, raw[k]) for k in ("guaranteed", "limit", "borrow_limit", "lend_limit")
                 if k in raw}
    try:
        return QueueSpec(**{"name": "", **scalars}, **resources)
    except (ValueError, TypeError) as exc:
        raise TraceError(path, line, "queue", str(exc)) from None


def _parse(path: Path) -> Any:
    """The YAML document at `path` (at most MAX_FILE_BYTES); TraceError with the line of whatever is wrong."""
    check_size(path, MAX_FILE_BYTES)
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), data[:exc.start].count(b"\n") + 1, "-", "not UTF-8") from None
    loader = _LineLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise TraceError(str(path), line, "-", f"not valid YAML: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise TraceError(str(path), loader.get_mark().line + 1, "-", f"not valid YAML: {problem}") from None
    finally:
        loader.dispose()


def load_queues(path: str | Path) -> QueueTree:
    """Parse and validate a queue file (at most MAX_FILE_BYTES, MAX_QUEUES queues)."""
    data = _parse(Path(path))
    if not isinstance(data, dict) or not isinstance(data.get("queues"), list) or not data["queues"]:
        raise TraceError(str(path), 1, "queues", "the file needs a non-empty list 'queues'")
    queues = data["queues"]
    lines = getattr(queues, "lines", [1] * len(queues))
    if len(queues) > MAX_QUEUES:
        raise TraceError(str(path), lines[MAX_QUEUES], "queues", f"more than {MAX_QUEUES} queues")
    units = data.get("gpu_units") or {}
    if not isinstance(units, dict):
        raise TraceError(str(path), data["__line__"], "gpu_units", "must be a mapping like {H100: 2000}")
    try:
        per_gpu = {name(str(k)): _milli(v, f"gpu_units.{k}") for k, v in units.items() if k != "__line__"}
    except ValueError as exc:
        raise TraceError(str(path), units.get("__line__", 1), "gpu_units", str(exc)) from None
    specs = [_queue(str(path), line, q) for q, line in zip(queues, lines, strict=True)]
    try:
        return QueueTree(specs, per_gpu)
    except ValueError as exc:
        raise TraceError(str(path), 1, "queues", str(exc)) from None


def assign_by_hash(name: str, leaves: Sequence[str]) -> str:
    """A stable leaf for a job name: sha256(name) modulo the number of leaves (sorted by name)."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    return sorted(leaves)[digest % len(leaves)]


def usage_units(usage: Mapping[str, ResourceVector]) -> dict[str, int]:
    return {q: v[GPU_UNITS] for q, v in usage.items()}


#: queues a trace's tenants become at most (`tenant_tree`): the largest by GPU-seconds, the others share OTHER
MAX_TENANT_QUEUES = 32
OTHER = "other"
#: `--queues tenants`: the trace's tenants become the queues (`tenant_tree`)
TENANTS = "tenants"
#: the queue of a job without a tenant
NO_TENANT = "default"


def tenant_tree(demand: Mapping[str, int], capacity_milli: int) -> tuple[QueueTree, dict[str, str]]:
    """The rule by which a trace's tenants become queues: one flat leaf queue per tenant (jobs without one go to
    NO_TENANT), the MAX_TENANT_QUEUES - 1 largest by GPU-seconds when there are more than MAX_TENANT_QUEUES, the
    rest merged into OTHER. Each leaf is guaranteed the cluster's GPUs in proportion to its tenants' GPU-seconds
    (`demand`: tenant -> milli-GPU-seconds), rounded down to a milli-GPU, with over-quota weight 1.
    Returns the tree and tenant -> leaf."""
    ranked = sorted(demand, key=lambda t: (-demand[t], t))
    kept = set(ranked if len(ranked) <= MAX_TENANT_QUEUES else ranked[:MAX_TENANT_QUEUES - 1])
    leaf_of = {t: t if t in kept else OTHER for t in ranked}
    totals: dict[str, int] = {}
    for tenant, work in demand.items():
        totals[leaf_of[tenant]] = totals.get(leaf_of[tenant], 0) + work
    everything = sum(totals.values()) or 1
    specs = [QueueSpec(leaf, guaranteed=ResourceVector({GPU_UNITS: capacity_milli * work // everything}))
             for leaf, work in sorted(totals.items())]
    return QueueTree(specs), leaf_of


def fit_guarantees(tree: QueueTree, nodes: Sequence[NodeSpec], scale: bool, where: str) -> QueueTree:
    """The tree, if its top-level queues' GPU guarantees fit the simulated cluster (`nodes`, in GPU units). Above
    it: with `scale`, every queue's guarantees and limits multiplied by capacity / guaranteed (rounded down);
    otherwise TraceError naming the queue file `where`, since a replay would run with promises it cannot keep."""
    capacity = sum(tree.gpu_units.get(g.model, DEFAULT_UNIT) for n in nodes for g in n.gpus)
    promised = sum(tree.specs[r].guaranteed.get(GPU_UNITS, 0) for r in tree.roots)
    if promised <= capacity:
        return tree
    if not scale:
        raise TraceError(where, 1, "guaranteed", f"the top-level queues are guaranteed {promised / 1000:g} GPUs, "
                         f"above the {capacity / 1000:g} of the simulated cluster ({len(nodes)} nodes); pass "
                         f"--scale-guarantees to multiply every guarantee and limit by {capacity / promised:.4f}")

    def scaled(amounts: ResourceVector | None) -> ResourceVector | None:
        return None if amounts is None else ResourceVector({k: v * capacity // promised for k, v in amounts.items()})

    return QueueTree([replace(s, guaranteed=scaled(s.guaranteed) or ResourceVector(), limit=scaled(s.limit),
                              borrow_limit=scaled(s.borrow_limit), lend_limit=scaled(s.lend_limit))
                      for s in tree.specs.values()], tree.gpu_units)
