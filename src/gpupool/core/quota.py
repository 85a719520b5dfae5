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
from dataclasses import dataclass
from fractions import Fraction

from gpupool.core.division import QueueNode, ShareRequest, divide_tree
from gpupool.core.model import JobSpec
from gpupool.core.queues import DEFAULT_UNIT, GPU_UNITS, NON_PREEMPTIBLE, QueueTree
from gpupool.core.resources import EMPTY, ResourceVector
from gpupool.core.units import CPU, MEMORY, MILLI


def add_usage(usage: dict[str, ResourceVector], tree: QueueTree, queue: str, charge: ResourceVector,
              sign: int = 1) -> None:
    """Add (sign=1) or remove (sign=-1) `charge` on `queue` and all its ancestors."""
    for name in tree.paths[queue]:
        current = usage.get(name, EMPTY)
        usage[name] = current + charge if sign > 0 else current - charge


def _cap(vector: ResourceVector | None, resource: str) -> int | None:
    if vector is None or resource not in vector:
        return None
    return vector[resource]


def _holdable(tree: QueueTree, name: str, resource: str) -> int | None:
    """The most queue `name` may ever hold of `resource` (limit, guarantee + borrow limit); None = no cap."""
    spec = tree.specs[name]
    caps = [_cap(spec.limit, resource)]
    borrow = _cap(spec.borrow_limit, resource)
    if borrow is not None:
        caps.append(spec.guaranteed[resource] + borrow)
    return min((c for c in caps if c is not None), default=None)


@dataclass(frozen=True, slots=True)
class _LevelRule:
    """What the rules read of queue `name`'s spec and its siblings' for one resource (None = no cap)."""

    name: str
    guaranteed: int
    limit: int | None
    borrow: int | None
    #: (sibling, its guarantee, its lend limit): what the lending rule reads of each sibling
    siblings: tuple[tuple[str, int, int | None], ...]
    #: the parent's capacity for its children: None = the cluster's, else capped by `parent_limit`
    parent_capacity: int | None
    parent_limit: int | None
    parent: str

    @classmethod
    def of(cls, tree: QueueTree, name: str, resource: str) -> _LevelRule:
        spec = tree.specs[name]
        siblings = tuple((s, tree.specs[s].guaranteed[resource], _cap(tree.specs[s].lend_limit, resource))
                         for s in tree.siblings(name))
        capacity = limit = None
        if spec.parent is not None:
            parent = tree.specs[spec.parent]
            borrow = _cap(parent.borrow_limit, resource)
            capacity = None if borrow is None else parent.guaranteed[resource] + borrow
            limit = _cap(parent.limit, resource)
        return cls(name, spec.guaranteed[resource], _cap(spec.limit, resource), _cap(spec.borrow_limit, resource),
                   siblings, capacity, limit, spec.parent or "the cluster")

    def capacity(self, cluster: ResourceVector | None, resource: str) -> int | None:
        """The parent's capacity for its children: the cluster's at the root, else the parent's guarantee plus
        what it may borrow, capped by its limit; None where that is the cluster's and `cluster` is None."""
        capacity = self.parent_capacity
        if capacity is None and cluster is not None:
            capacity = cluster[resource]
        if self.parent_limit is None:
            return capacity
        return self.parent_limit if capacity is None else min(capacity, self.parent_limit)


def _rule(tree: QueueTree, name: str, resource: str) -> _LevelRule:
    key = (_LevelRule, name, resource)
    rule = tree.derived.get(key)
    if rule is None:
        rule = tree.derived[key] = _LevelRule.of(tree, name, resource)
    assert isinstance(rule, _LevelRule)
    return rule


def _level_reason(tree: QueueTree, name: str, used: Mapping[str, ResourceVector], resource: str,
                  cluster: ResourceVector | None, extra: int) -> str:
    """The first rule queue `name` breaks in `resource` if it held `extra` more (its siblings unchanged)."""
    mine = used.get(name, EMPTY)[resource] + extra
    if resource.startswith(NON_PREEMPTIBLE):
        base = resource.removeprefix(NON_PREEMPTIBLE)
        if mine > tree.specs[name].guaranteed[base]:
            return f"queue {name}: non-preemptible jobs must fit within the guaranteed {base}"
        return ""
    rule = _rule(tree, name, resource)
    if rule.limit is not None and mine > rule.limit:
        return f"queue {name} would exceed its {resource} limit ({mine} > {rule.limit})"
    over = mine - rule.guaranteed
    if rule.borrow is not None and over > rule.borrow:
        return f"queue {name} would borrow {over} {resource}, more than its borrow limit {rule.borrow}"
    level, kept = mine, 0
    for sibling, guaranteed, lend in rule.siblings:
        theirs = used.get(sibling, EMPTY)[resource]
        level += theirs
        if lend is not None:  # a sibling keeps the unused guarantee it does not lend
            kept += max(0, max(0, guaranteed - theirs) - lend)
    capacity = rule.capacity(cluster, resource)
    if capacity is not None and level + kept > capacity:
        kept_note = f" while its siblings keep {kept} they do not lend" if kept else ""
        return (f"queue {name}: {rule.parent} has {capacity} {resource} for its children, they would use "
                f"{level}{kept_note}")
    return ""


def admission_reason(tree: QueueTree, used: Mapping[str, ResourceVector], queue: str, charge: ResourceVector,
                     cluster: ResourceVector | None) -> str:
    """"" if `queue` may take `charge` on top of `used` (usage per queue incl. ancestors), else why not.

    Every resource the leaf would then use is checked at every level of its path; a charge raises only
    the path's usage, so the siblings that the lending rule reads are the same before and after. With
    `cluster` None (a check before placement), a parent whose capacity is the cluster's does not bound its
    children: a job the cluster has no room for is left to placement, which finds no node for it (it waits for
    room, and may get a reservation) instead of being refused as over quota; what siblings keep unlent of the
    cluster is then checked after placement, with the cluster given.
    """
    if queue not in tree.specs or not tree.is_leaf(queue):
        return f"unknown leaf queue {queue!r}"
    held = used.get(queue, EMPTY)
    resources = sorted(r for r in {*held, *charge} if tree.checks(r))
    for name in tree.paths[queue]:
        for resource in resources:
            reason = _level_reason(tree, name, used, resource, cluster, charge[resource])
            if reason:
                return reason
    return ""


def headroom(tree: QueueTree, used: Mapping[str, ResourceVector], queue: str,
             cluster: ResourceVector | None) -> dict[str, int]:
    """Per resource the admission rules read: the most leaf `queue` could take on top of `used` with every rule
    still kept (negative when one is already broken); a resource no rule bounds (possible with `cluster` None)
    is left out. A charge within it on every resource is admitted (`admission_reason` with the same `cluster`
    gives ""); each rule's room shrinks by at most what any queue's usage grows."""
    if queue not in tree.specs or not tree.is_leaf(queue):
        raise ValueError(f"unknown leaf queue {queue!r}")
    resources = sorted(r for r in {*tree.constrained, NON_PREEMPTIBLE + GPU_UNITS} if tree.checks(r))
    rooms = {}
    for r in resources:
        bounded = [room for name in tree.paths[queue]
                   if (room := _level_room(tree, name, used, r, cluster)) is not None]
        if bounded:
            rooms[r] = min(bounded)
    return rooms


def _level_room(tree: QueueTree, name: str, used: Mapping[str, ResourceVector], resource: str,
                cluster: ResourceVector | None) -> int | None:
    """The most queue `name` could take of `resource` before `_level_reason` names a rule (None: no bound)."""
    mine = used.get(name, EMPTY)[resource]
    if resource.startswith(NON_PREEMPTIBLE):
        return tree.specs[name].guaranteed[resource.removeprefix(NON_PREEMPTIBLE)] - mine
    rule = _rule(tree, name, resource)
    level, kept = mine, 0
    for sibling, guaranteed, lend in rule.siblings:
        theirs = used.get(sibling, EMPTY)[resource]
        level += theirs
        if lend is not None:
            kept += max(0, max(0, guaranteed - theirs) - lend)
    capacity = rule.capacity(cluster, resource)
    rooms = [] if capacity is None else [capacity - level - kept]
    if rule.limit is not None:
        rooms.append(rule.limit - mine)
    if rule.borrow is not None:
        rooms.append(rule.guaranteed + rule.borrow - mine)
    return min(rooms, default=None)


def admission_after(tree: QueueTree, after: Mapping[str, ResourceVector], queue: str,
                    cluster: ResourceVector) -> str:
    """The admission rules on usage that already includes the new job (every resource in use)."""
    return admission_reason(tree, after, queue, EMPTY, cluster)


def minimal_charge(job: JobSpec, tree: QueueTree) -> ResourceVector:
    """The least a job can count against its queues wherever it lands (cheapest allowed GPU model)."""
    units = demand_units(job, tree)
    amounts = {GPU_UNITS: units, CPU: sum(t.shape.cpu_milli for t in job.tasks),
               MEMORY: sum(t.shape.memory_mib for t in job.tasks)}
    if not job.preemptible and units:
        amounts[NON_PREEMPTIBLE + GPU_UNITS] = units
    return ResourceVector._trusted({k: v for k, v in amounts.items() if v})  # sums of validated amounts


def demand_units(job: JobSpec, tree: QueueTree) -> int:
    """A pending job's GPU-unit demand before placement (the cheapest allowed model's unit)."""
    total = 0
    for task in job.tasks:
        models = task.shape.gpu_models
        unit = DEFAULT_UNIT
        if models and tree.gpu_units:
            unit = min(tree.gpu_units.get(m, DEFAULT_UNIT) for m in models)
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
            units = demand_units(job, tree)
            for name in tree.paths[job.queue]:
                demand[name] = demand.get(name, 0) + units
    order = {name: i for i, name in enumerate(sorted(tree.specs))}

    def node(name: str) -> QueueNode:
        spec = tree.specs[name]
        limit = _holdable(tree, name, GPU_UNITS)
        request = ShareRequest(
            name=name, request=used.get(name, EMPTY)[GPU_UNITS] + demand.get(name, 0),
            deserved=spec.guaranteed[GPU_UNITS], limit=-1 if limit is None else limit,
            weight=spec.over_quota_weight, priority=spec.priority, created=order[name],
            usage=(history or {}).get(name, Fraction(0)))
        return QueueNode(request, tuple(node(c) for c in tree.children.get(name, [])))

    return divide_tree(capacity_units, [node(r) for r in tree.roots], k_value)
