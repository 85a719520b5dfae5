"""Node free state and the node table a cycle works on.

`NodeKind` is what never changes on a node (model, capacities, whether it takes untrusted images);
`NodeState` is what placement changes (free CPU, memory, milli-GPU and GPU memory per device, and the
sharing group of each partly used GPU). Every placement policy is a pure function of (kind, state, task
shape), which is what lets `gpupool.core.placement` cache scores.

`NodeTable` holds one `NodeState` per node, nodes sorted by name (so index order is name order and
"lowest name wins" is "lowest index wins"), an int key per node naming its (kind, state), and `seq`,
the number of changes made: a reader that caches per-node values by key remembers the `seq` it saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.core.model import DeviceShare, NodeSpec, TaskShape
from gpupool.core.units import MILLI


@dataclass(frozen=True, slots=True)
class NodeKind:
    """The static half of a node: equal kinds are interchangeable for placement."""

    model: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_memory_mib: tuple[int, ...]
    untrusted_images: bool = True
    labels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, spec: NodeSpec) -> NodeKind:
        return cls(
            model=spec.gpu_model,
            cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib,
            gpu_count=len(spec.gpus),
            gpu_memory_mib=tuple(g.memory_mib for g in spec.gpus),
            untrusted_images=spec.untrusted_images,
            labels=spec.labels,
        )

    @property
    def gpu_milli(self) -> int:
        return self.gpu_count * MILLI


def shape_tag(shape: TaskShape) -> str:
    """The placement tag of a task (GPU-clustering affinity class): "" for CPU-only tasks."""
    if shape.gpu_count == 0:
        return ""
    return "share-gpu" if shape.is_shared else f"{shape.gpu_count}-gpu"


#: The group of a GPU that fractions of two groups were put on from outside (allocations loaded by a control
#: plane, made before groups existed): it takes no fraction until it is free again.
MIXED_GROUP = "\x00mixed"


@dataclass(frozen=True, slots=True)
class NodeState:
    """The free half of a node. `tags` is the multiset of placed tasks' tags as sorted (tag, count).

    `gpu_groups` is the sharing group of each GPU that fractions use (`TaskShape.share_group`), "" for the
    others; it is () when every entry would be "" (always so without tenancy), so equal states compare equal.
    """

    cpu_free: int
    memory_free: int
    gpu_free: tuple[int, ...]
    gpu_memory_free: tuple[int, ...]
    tags: tuple[tuple[str, int], ...] = ()
    schedulable: bool = True
    gpu_groups: tuple[str, ...] = ()

    @classmethod
    def empty(cls, kind: NodeKind) -> NodeState:
        return cls(kind.cpu_milli, kind.memory_mib, (MILLI,) * kind.gpu_count, kind.gpu_memory_mib)

    @property
    def gpu_idle(self) -> int:
        """Free milli-GPU summed over the node's GPUs."""
        return sum(self.gpu_free)

    def group_of(self, gpu: int) -> str:
        """The sharing group of GPU `gpu` ("" when free, used whole, or shared without tenancy)."""
        return self.gpu_groups[gpu] if self.gpu_groups else ""

    def take(self, shape: TaskShape, shares: Sequence[DeviceShare]) -> NodeState:
        """The state after placing `shape` on `shares`; raises ValueError if it does not fit (a bug)."""
        return self._moved(shape, shares, -1)

    def give(self, shape: TaskShape, shares: Sequence[DeviceShare]) -> NodeState:
        """The state after removing a task of `shape` that held `shares`."""
        return self._moved(shape, shares, +1)

    def _moved(self, shape: TaskShape, shares: Sequence[DeviceShare], sign: int) -> NodeState:
        gpu = list(self.gpu_free)
        gmem = list(self.gpu_memory_free)
        short = False  # only the GPUs the shares name change, so only they can go below zero
        for share in shares:
            g = share.index
            if not 0 <= g < len(gpu):
                raise ValueError(f"placement of {shape} on {shares} overcommits the node: no GPU {g}")
            gpu[g] += sign * share.milli
            gmem[g] += sign * share.memory_mib
            short = short or gpu[g] < 0 or gmem[g] < 0
        cpu = self.cpu_free + sign * shape.cpu_milli
        mem = self.memory_free + sign * shape.memory_mib
        if short or cpu < 0 or mem < 0:
            raise ValueError(f"placement of {shape} on {shares} overcommits the node")
        groups = self.gpu_groups
        if shares and (groups or shape.share_group):
            groups = _moved_groups(self, gpu, shape, shares, sign)
        return NodeState(cpu, mem, tuple(gpu), tuple(gmem), _moved_tags(self.tags, shape, -sign),
                         self.schedulable, groups)

    def with_schedulable(self, schedulable: bool) -> NodeState:
        return replace(self, schedulable=schedulable)


def _moved_groups(before: NodeState, gpu_after: list[int], shape: TaskShape, shares: Sequence[DeviceShare],
                  sign: int) -> tuple[str, ...]:
    """The GPU groups after the move: a GPU free again has none; a fraction placed on a free GPU gives it the
    fraction's group, on a GPU of another group (possible only from outside) MIXED_GROUP."""
    groups = list(before.gpu_groups) if before.gpu_groups else [""] * len(gpu_after)
    for share in shares:
        g = share.index
        if gpu_after[g] >= MILLI:
            groups[g] = ""
        elif sign < 0 and shape.is_shared:
            was_free = before.gpu_free[g] >= MILLI
            groups[g] = shape.share_group if was_free or groups[g] == shape.share_group else MIXED_GROUP
    return tuple(groups) if any(groups) else ()


def _moved_tags(tags: tuple[tuple[str, int], ...], shape: TaskShape, sign: int) -> tuple[tuple[str, int], ...]:
    tag = shape_tag(shape)
    if not tag:
        return tags
    for k, (name, count) in enumerate(tags):
        if name == tag:
            if count + sign < 0:
                raise ValueError(f"tag {tag} removed more often than placed")
            kept = ((tag, count + sign),) if count + sign else ()
            return tags[:k] + kept + tags[k + 1:]
    if sign < 0:
        raise ValueError(f"tag {tag} removed more often than placed")
    return tuple(sorted((*tags, (tag, sign))))


#: distinct (kind, state) pairs a table names before it numbers them again (readers' arrays indexed by key stay
#: within this many entries)
_KEY_LIMIT = 1 << 16
#: the changes `NodeTable.changed_since` can look back over (the log is trimmed to this once twice as long)
_LOG_KEEP = 256
#: (key, shape) placements whose resulting state `NodeTable.take` remembers before it starts again
MOVES_KEPT = 10_000


class NodeTable:
    """The free state of every node, indexed by name order.

    Only `set_state` (and `take`, through it) changes a state, and it bumps `seq`. Values derived from one
    node's (kind, state) may be cached by readers under its key; see the module docstring.

    `keys[i]` is an int in [0, key_count) naming node i's (kind, state): nodes with equal keys are
    interchangeable, so a reader may cache a per-node value under the key (an int hashes and compares far
    faster than the pair, and indexes an array). Once _KEY_LIMIT pairs have been named, the table numbers the
    pairs of its nodes again from 0 and drops everything in `derived`: readers keep their key caches there,
    so no cache outlives the numbering it was made under. `numbering` counts the numberings so far.

    Its caches, each an invariant a test checks:

    - `_key_ids` (with `keys`, `_key_array`): equal (kind, state) pairs share a key and different pairs never do,
      before and after a renumbering; `key_array()` equals `keys`, and every key is below `key_count`
      (tests/core/test_placement_cache.py::test_node_keys_name_kind_and_state).
    - `derived`: readers' caches (the placement engine's scores and picks, `take`'s memory, the cycle's capacity);
      emptied on every renumbering, so a value in it is always one made under the current numbering (the same
      test, and test_scores_stay_exact_across_a_renumbering).
    - `take`'s memory (`derived[NodeTable.take]`, at most MOVES_KEPT entries): (key before, shape) -> (shares, state
      after, key after), replayed only for the very shares object it was made for, so the node ends exactly as
      `NodeState.take` leaves it (test_a_remembered_placement_is_reused_only_for_the_same_shares_object).
    - `_log`: the node index of each of the last changes, oldest first; `changed_since(seq)` answers from it only
      when it still reaches back to `seq`, else None (readers then gather every node again: the "patched, short
      log" cases of test_cached_scores_match_fresh_evaluation).
    """

    def __init__(self, specs: Iterable[NodeSpec]) -> None:
        ordered = sorted(specs, key=lambda s: s.name)
        self.specs: tuple[NodeSpec, ...] = tuple(ordered)
        self.names: tuple[str, ...] = tuple(s.name for s in ordered)
        if len(set(self.names)) != len(self.names):
            raise ValueError("node names must be unique")
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        interned: dict[NodeKind, NodeKind] = {}
        self.kinds: tuple[NodeKind, ...] = tuple(interned.setdefault(NodeKind.of(s), NodeKind.of(s)) for s in ordered)
        ordinals = {kind: k for k, kind in enumerate(interned)}
        #: per node, its kind's ordinal: pairs are named by (ordinal, state), cheaper to hash than the kind
        self._kind_of: tuple[int, ...] = tuple(ordinals[kind] for kind in self.kinds)
        self.states: list[NodeState] = [NodeState.empty(k) for k in self.kinds]
        self._key_ids: dict[tuple[int, NodeState], int] = {}
        self._next_key = 0
        self.keys: list[int] = [self._name(k, s) for k, s in zip(self._kind_of, self.states, strict=True)]
        self.derived: dict[object, object] = {}
        #: indices of the nodes that are not schedulable now
        self.unschedulable: set[int] = set()
        #: number of state changes ever made
        self.seq = 0
        #: the node index each of the last (up to 2 * _LOG_KEEP) changes was made to, oldest first
        self._log: list[int] = []
        self._key_array = np.array(self.keys, dtype=np.int64)
        self.numbering = 0

    def __len__(self) -> int:
        return len(self.names)

    def set_state(self, i: int, state: NodeState, key: int | None = None) -> None:
        """Give node i `state`. `key`, if given, is the key that names (node i's kind, `state`) under the current
        `numbering` (read from `keys` while node i was in `state`): it spares naming the pair again."""
        if state.schedulable != self.states[i].schedulable:
            if state.schedulable:
                self.unschedulable.discard(i)
            else:
                self.unschedulable.add(i)
        self.states[i] = state
        self.keys[i] = self._key_array[i] = self._key(self._kind_of[i], state) if key is None else key
        self.seq += 1
        self._log.append(i)
        if len(self._log) > 2 * _LOG_KEEP:
            del self._log[:-_LOG_KEEP]

    def take(self, i: int, shape: TaskShape, shares: tuple[DeviceShare, ...]) -> None:
        """`set_state(i, states[i].take(shape, shares))`, memoised: the state a placement leaves and its key are
        kept per (key before, shape) with the shares object they were made for, and reused when that same object
        comes again (a placement engine hands out one shares object per key and shape, and warm cycles repeat
        the placements of the last)."""
        moves = self.derived.get(NodeTable.take)
        if not isinstance(moves, dict) or len(moves) >= MOVES_KEPT:
            moves = self.derived[NodeTable.take] = {}
        before = (self.keys[i], shape)
        known = moves.get(before)
        if known is not None and known[0] is shares:
            self.set_state(i, known[1], known[2])
            return
        state = self.states[i].take(shape, shares)
        self.set_state(i, state)  # may number the pairs again, dropping `moves` with everything derived
        moves[before] = (shares, state, self.keys[i])

    @property
    def key_count(self) -> int:
        """Keys are below this."""
        return self._next_key

    def _key(self, kind: int, state: NodeState) -> int:
        key = self._key_ids.get((kind, state))
        if key is None:
            if self._next_key >= _KEY_LIMIT:
                self._renumber()
            key = self._name(kind, state)
        return key

    def _name(self, kind: int, state: NodeState) -> int:
        key = self._key_ids.get((kind, state))
        if key is None:
            key = self._key_ids[(kind, state)] = self._next_key
            self._next_key += 1
        return key

    def _renumber(self) -> None:
        """Name the pairs of the nodes' current states from 0 again; every derived value goes."""
        self._key_ids.clear()
        self._next_key = 0
        self.numbering += 1
        self.derived.clear()
        for i, (kind, state) in enumerate(zip(self._kind_of, self.states, strict=True)):
            self.keys[i] = self._key_array[i] = self._name(kind, state)

    def changed_since(self, seq: int, most: int) -> list[int] | None:
        """Indices of the nodes changed since `seq` was current, oldest first (a node once per change), or None when
        that is more than `most` changes or more than the table remembers."""
        count = self.seq - seq
        if count > most or count > len(self._log) or seq < 0:
            return None
        return self._log[len(self._log) - count:]

    def key_array(self) -> np.ndarray:
        """`keys` as an int64 array, kept in step with it (read-only)."""
        return self._key_array

    @property
    def total_gpu_milli(self) -> int:
        return sum(k.gpu_milli for k in self.kinds)
