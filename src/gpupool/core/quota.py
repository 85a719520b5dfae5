"""Queue usage, admission under quotas (limits, borrowing, lending), and per-cycle fair shares.

`admission_reason` is the one rule every action uses before committing a placement: it returns
"" when the queue path of a job may take `charge` more, else the first violated rule as a phrase.
Rules at every level of the job's path (leaf first), for each resource the rule names:

1. limit:       used' <= limit
2. borrowing:   used' - guaranteed <= borrow_limit
3. lending:     sum of the siblings' used' + what each other sibling keeps for itself
                (its unused guarantee beyond its lend_limit) <= the parent's capacity
4. guarantee:   non-preemptible jobs together fit within guaranteed (they may not borrow); their
                usage is counted under "np:<resource>" by `QueueTree.charge`

The parent's capacity is the cluster capacity at the root level, and otherwise the parent's own
guarantee plus what it may borrow, capped by its limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from gpupool.core.division import QueueNode, ShareRequest, divide_tree
from gpupool.core.model import JobSpec
from gpupool.core.queues import DEFAULT_UNIT, GPU_UNITS, NON_PREEMPTIBLE, QueueTree
from gpupool.core.resources import ResourceVector
from gpupool.core.units import CPU, MEMORY, MILLI

_NONE = ResourceVector()


def add_usage(usage: dict[str, ResourceVector], tree: QueueTree, queue: str, charge: ResourceVector,
              sign: int = 1) -> None:
    """Add (sign=1) or remove (sign=-1) `charge` on `queue` and all its ancestors."""
    for name in tree.paths[queue]:
        current = usage.get(name, _NONE)
        usage[name] = current + charge if sign > 0 else current - charge


def _cap(vector: ResourceVector | None, resource: str) -> int | None:
    if vector is None or resource not in vector:
        return None
    return vector[resource]


def _keeps(tree: QueueTree, name: str, used: Mapping[str, ResourceVector], resource: str) -> int:
    """What queue `name` keeps for itself: its unused guarantee that it does not lend."""
    spec = tree.specs[name]
    guaranteed = spec.guaranteed[resource]
    lend = _cap(spec.lend_limit, resource)
    unused = max(0, guaranteed - used.get(name, _NONE)[resource])
    return max(0, unused - lend) if lend is not None else 0


def _holdable(tree: QueueTree, name: str, resource: str) -> int | None:
    """The most queue `name` may ever hold of `resource` (limit, guarantee + borrow limit); None = no cap."""
    spec = tree.specs[name]
    caps = [_cap(spec.limit, resource)]
    borrow = _cap(spec.borrow_limit, resource)
    if borrow is not None:
        caps.append(spec.guaranteed[resource] + borrow)
    return min((c for c in caps if c is not None), default=None)


def _parent_capacity(tree: QueueTree, name: str, resource: str, cluster: ResourceVector) -> int:
    parent = tree.specs[name].parent
    if parent is None:
        return cluster[resource]
    spec = tree.specs[parent]
    borrow = _cap(spec.borrow_limit, resource)
    cap = cluster[resource] if borrow is None else spec.guaranteed[resource] + borrow
    limit = _cap(spec.limit, resource)
    return cap if limit is None else min(cap, limit)


def _level_reason(tree: QueueTree, name: str, used: Mapping[str, ResourceVector], resource: str,
                  cluster: ResourceVector, extra: int) -> str:
    """The first rule queue `name` breaks in `resource` if it held `extra` more (its siblings unchanged)."""
    spec = tree.specs[name]
    mine = used.get(name, _NONE)[resource] + extra
    if resource.startswith(NON_PREEMPTIBLE):
        base = resource.removeprefix(NON_PREEMPTIBLE)
        if mine > spec.guaranteed[base]:
            return f"queue {name}: non-preemptible jobs must fit within the guaranteed {base}"
        return ""
    limit = _cap(spec.limit, resource)
    if limit is not None and mine > limit:
        return f"queue {name} would exceed its {resource} limit ({mine} > {limit})"
    over = mine - spec.guaranteed[resource]
    borrow = _cap(spec.borrow_limit, resource)
    if borrow is not None and over > borrow:
        return f"queue {name} would borrow {over} {resource}, more than its borrow limit {borrow}"
    siblings = tree.siblings(name)
    level = mine + sum(used.get(s, _NONE)[resource] for s in siblings)
    kept = sum(_keeps(tree, s, used, resource) for s in siblings)
    capacity = _parent_capacity(tree, name, resource, cluster)
    if level + kept > capacity:
        parent = spec.parent or "the cluster"
        kept_note = f" while its siblings keep {kept} they do not lend" if kept else ""
        return f"queue {name}: {parent} has {capacity} {resource} for its children, they would use {level}{kept_note}"
    return ""


def admission_reason(tree: QueueTree, used: Mapping[str, ResourceVector], queue: str, charge: ResourceVector,
                     cluster: ResourceVector) -> str:
    """"" if `queue` may take `charge` on top of `used` (usage per queue incl. ancestors), else why not.

    Every resource the leaf would then use is checked at every level of its path; a charge raises only
    the path's usage, so the siblings that the lending rule reads are the same before and after.
    """
    if queue not in tree.specs or not tree.is_leaf(queue):
        return f"unknown leaf queue {queue!r}"
    held = used.get(queue, _NONE)
    resources = sorted(r for r in {*held, *charge} if tree.checks(r))
    for name in tree.paths[queue]:
        for resource in resources:
            reason = _level_reason(tree, name, used, resource, cluster, charge[resource])
            if reason:
                return reason
    return ""


def admission_after(tree: QueueTree, after: Mapping[str, ResourceVector], queue: str,
                    cluster: ResourceVector) -> str:
    """The admission rules on usage that already includes the new job (every resource in use)."""
    return admission_reason(tree, after, queue, _NONE, cluster)


def minimal_charge(job: JobSpec, tree: QueueTree) -> ResourceVector:
    """The least a job can count against its queues wherever it lands (cheapest allowed GPU model)."""
    units = demand_units(job, tree)
    amounts = {GPU_UNITS: units, CPU: sum(t.shape.cpu_milli for t in job.tasks),
               MEMORY: sum(t.shape.memory_mib for t in job.tasks)}
    if not job.preemptible and units:
        amounts[NON_PREEMPTIBLE + GPU_UNITS] = units
    return ResourceVector({k: v for k, v in amounts.items() if v})


def demand_units(job: JobSpec, tree: QueueTree) -> int:
    """A pending job's GPU-unit demand before placement (the cheapest allowed model's unit)."""
    total = 0
    for task in job.tasks:
        models = task.shape.gpu_models
        unit = min((tree.gpu_units.get(m, DEFAULT_UNIT) for m in models), default=DEFAULT_UNIT)
        total += task.shape.total_gpu_milli * unit // MILLI
    return total


def fair_shares(tree: QueueTree, used: Mapping[str, ResourceVector], pending: Iterable[JobSpec],
                capacity_units: int, history: Mapping[str, Fraction] | None = None,
                k_value: Fraction = Fraction(1)) -> dict[str, int]:
    """GPU-unit fair share of every queue this cycle (KAI two-phase division, ALGORITHMS.md §4.4-4.5).

    A queue's request is its usage plus its subtree's pending demand, and it is never owed more than it may
    hold (its limit, and its guarantee plus its borrow limit); `history` is the normalised time-decayed usage
    u_q that only shapes the over-quota phase.
    """
    demand: dict[str, int] = {}
    for job in pending:
        if job.queue in tree.paths:
            for name in tree.paths[job.queue]:
                demand[name] = demand.get(name, 0) + demand_units(job, tree)
    order = {name: i for i, name in enumerate(sorted(tree.specs))}

    def node(name: str) -> QueueNode:
        spec = tree.specs[name]
        limit = _holdable(tree, name, GPU_UNITS)
        request = ShareRequest(
            name=name, request=used.get(name, _NONE)[GPU_UNITS] + demand.get(name, 0),
            deserved=spec.guaranteed[GPU_UNITS], limit=-1 if limit is None else limit,
            weight=spec.over_quota_weight, priority=spec.priority, created=order[name],
            usage=(history or {}).get(name, Fraction(0)))
        return QueueNode(request, tuple(node(c) for c in tree.children.get(name, [])))

    return divide_tree(capacity_units, [node(r) for r in tree.roots], k_value)
