"""The placement engine: for a task shape, the best node and its devices, at cache speed.

Filters and scores are pure functions of (node kind, node state, shape), so the engine

1. memoises each (kind, state, shape) evaluation, per table and shape, in an int64 array indexed by the
   table's int key of (kind, state): equal nodes are evaluated once;
2. brings a shape's scores up to date, after any change to the table, by reading that array at the key of
   each node changed since (up to `PATCH_MOST` changes, from the table's change log) or else with one
   vectorised gather of it at every node's key (`INFEASIBLE` + reason where a filter rejects); only nodes in
   states this shape has never met are evaluated, in Python (after a gather, only once a reader meets one:
   `choose` sees them for free, since "not evaluated" is the largest int64 and wins its argmax);
3. picks the argmax (numpy returns the first, i.e. the lowest node name) or, with the random
   tie-break, a seeded uniform choice among the maxima.

A decision therefore costs O(node states new to this shape) in Python plus a few vectorised passes over
the nodes, not O(nodes x plugins). Device picks of a plugin that draws no random numbers are memoised
under the same key.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

import numpy as np

from gpupool.core.framework.interfaces import DevicePlugin, FilterPlugin, ScorePlugin
from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState, NodeTable

#: Scores below FEASIBLE_MIN mean "rejected": INFEASIBLE + the id of the first filter's reason.
INFEASIBLE = np.iinfo(np.int64).min
FEASIBLE_MIN = INFEASIBLE + (1 << 20)
TieBreak = Literal["name", "random"]
#: the rejection reason of nodes a caller excludes (held by reservations)
RESERVED = "node reserved for another job"
#: a score no evaluation gives: "not evaluated yet" in the per-key arrays
UNKNOWN = np.iinfo(np.int64).max
_UNKNOWN_INT = int(UNKNOWN)
#: at most this many node changes since a shape's scores were current are patched one by one; more are gathered
PATCH_MOST = 16


class _ShapeScores:
    """One task shape's cached placement values on one table (`table.derived[placer][shape]`), keyed by the
    table's node keys, which name (kind, state) pairs; every plugin is a pure function of (kind, state, shape).

    Invariants (tests/core/test_placement_cache.py: test_cached_scores_match_fresh_evaluation over every policy,
    patched and gathered; test_scores_stay_exact_across_a_renumbering):

    - `by_key[k]` is UNKNOWN or exactly what `Placer._evaluate` gives a node whose pair key `k` names; `picks[k]`
      is what a device plugin that draws no random numbers picks for it. Both are dropped with `derived` when the
      table numbers its pairs again, so no entry outlives the numbering it was made under.
    - When `seen == table.seq`, `scores[i] == by_key[keys[i]]` for every node i, except that after a gather
      (`unresolved`) `scores` may hold UNKNOWN, which `Placer._resolved` evaluates before any score is read.
    - `explained` holds the reasons tally of `scores` as they were at table seq `explained_at`.
    """

    __slots__ = ("scores", "by_key", "picks", "seen", "unresolved", "explained", "explained_at")

    def __init__(self, n: int) -> None:
        self.scores = np.full(n, INFEASIBLE, dtype=np.int64)
        self.by_key = np.full(0, UNKNOWN, dtype=np.int64)  # the table's node key -> score (UNKNOWN: not yet)
        self.picks: dict[int, tuple[DeviceShare, ...]] = {}  # the table's node key -> devices (a pure plugin's)
        self.seen = -1  # the table's `seq` when `scores` was brought up to date
        self.unresolved = False  # whether `scores` may hold UNKNOWN (nodes in states this shape has not met)
        self.explained: list[tuple[str, int]] = []
        self.explained_at = -1


class Placer:
    """Filters + weighted scores + a device plugin + a tie-break rule, with per-table caches.

    Caches live in `table.derived` under this Placer (one `_ShapeScores` per shape: its docstring states the
    invariants and the tests that check them), so one Placer can serve many tables and a table can serve many
    Placers. Results are exact: a cached score equals a fresh evaluation. Nothing outside this module reads the
    caches; callers see only `scores`, `choose`, `pick` and `explain`.
    """

    def __init__(
        self,
        filters: Sequence[FilterPlugin],
        scores: Sequence[tuple[ScorePlugin, int]],
        devices: DevicePlugin,
        tie_break: TieBreak = "name",
    ) -> None:
        self.filters = tuple(filters)
        self.weighted = tuple(scores)
        self.devices = devices
        self.tie_break = tie_break
        self._reason_ids: dict[str, int] = {}
        self._reasons: list[str] = []

    def _evaluate(self, kind: NodeKind, state: NodeState, shape: TaskShape) -> int:
        """The node's combined score for `shape`, or INFEASIBLE + the rejection reason's id."""
        for plugin in self.filters:
            status = plugin.filter(kind, state, shape)
            if not status.is_success:
                return int(INFEASIBLE) + self._reason_id(status.reason or plugin.name)
        return sum(weight * plugin.score(kind, state, shape) for plugin, weight in self.weighted)

    def _reason_id(self, reason: str) -> int:
        rid = self._reason_ids.get(reason)
        if rid is None:
            rid = self._reason_ids[reason] = len(self._reasons)
            self._reasons.append(reason)
        return rid

    def scores(self, table: NodeTable, shape: TaskShape) -> np.ndarray:
        """Every node's current combined score for `shape` (read-only view; do not mutate)."""
        return self._resolved(table, shape, self._current(table, shape)).scores

    def _entry(self, table: NodeTable, shape: TaskShape) -> _ShapeScores:
        """The shape's cache entry for `table`, as it is."""
        caches = table.derived.get(self)
        if not isinstance(caches, dict):
            caches = table.derived[self] = {}
        entry = caches.get(shape)
        if entry is None:
            entry = caches[shape] = _ShapeScores(len(table))
        return entry

    def _current(self, table: NodeTable, shape: TaskShape) -> _ShapeScores:
        """The shape's cache entry, brought up to date with the table, except that after a gather its scores may
        hold UNKNOWN for nodes in states the shape has not met (`unresolved`; `_resolved` evaluates them)."""
        entry = self._entry(table, shape)
        if entry.seen == table.seq:
            return entry
        if len(entry.by_key) < table.key_count:
            grown = np.full(max(table.key_count, 2 * len(entry.by_key)), UNKNOWN, dtype=np.int64)
            grown[:len(entry.by_key)] = entry.by_key
            entry.by_key = grown
        changed = table.changed_since(entry.seen, PATCH_MOST)
        if changed is not None:  # a few nodes changed: patch their scores in place
            by_key, keys, scores, known = entry.by_key, table.keys, entry.scores, entry.by_key.item
            for i in changed:  # Python ints: a numpy scalar per read and compare would cost twice as much
                score = known(keys[i])
                if score == _UNKNOWN_INT:
                    score = by_key[keys[i]] = self._evaluate(table.kinds[i], table.states[i], shape)
                scores[i] = score
        else:
            entry.scores = entry.by_key.take(table.key_array())  # take: faster than fancy indexing
            entry.unresolved = True
        entry.seen = table.seq
        return entry

    def _resolved(self, table: NodeTable, shape: TaskShape, entry: _ShapeScores) -> _ShapeScores:
        """`entry` with every UNKNOWN score a gather left evaluated (into the shape's memo as well)."""
        if entry.unresolved:
            by_key, keys, scores = entry.by_key, table.keys, entry.scores
            for i in np.flatnonzero(scores == UNKNOWN).tolist():
                score = by_key.item(keys[i])  # nodes of one key: evaluated once
                if score == _UNKNOWN_INT:
                    score = by_key[keys[i]] = self._evaluate(table.kinds[i], table.states[i], shape)
                scores[i] = score
            entry.unresolved = False
        return entry

    def choose(self, table: NodeTable, shape: TaskShape, rng: random.Random,
               excluded: frozenset[int] = frozenset()) -> int | None:
        """Index of the node to place `shape` on, or None if no node is feasible; nodes in `excluded` are
        treated as infeasible (as if unschedulable, without changing the table or its caches)."""
        if len(table) == 0:
            return None
        entry = self._current(table, shape)
        best = int(entry.scores.argmax())
        if entry.unresolved:  # none left if the maximum is not UNKNOWN, the largest int64
            if entry.scores.item(best) == _UNKNOWN_INT:
                best = int(self._resolved(table, shape, entry).scores.argmax())
            entry.unresolved = False
        scores = entry.scores
        if excluded and (best in excluded or self.tie_break == "random"):  # else `best` is the masked argmax too
            scores = scores.copy()
            scores[list(excluded)] = INFEASIBLE
            best = int(scores.argmax())
        if scores[best] < FEASIBLE_MIN:
            return None
        if self.tie_break == "random":
            ties = np.flatnonzero(scores == scores[best])
            best = int(ties[rng.randrange(len(ties))])
        return best

    def pick(self, table: NodeTable, i: int, shape: TaskShape, rng: random.Random) -> tuple[DeviceShare, ...]:
        """The devices node `i` gives `shape` (memoised under the node's key unless the plugin draws from `rng`)."""
        if self.devices.uses_rng:
            return self.devices.pick_devices(table.kinds[i], table.states[i], shape, rng)
        picks = self._entry(table, shape).picks
        key = table.keys[i]
        shares = picks.get(key)
        if shares is None:
            shares = picks[key] = self.devices.pick_devices(table.kinds[i], table.states[i], shape, rng)
        return shares

    def explain(self, table: NodeTable, shape: TaskShape,
                excluded: frozenset[int] = frozenset()) -> list[tuple[str, int]]:
        """Why nodes reject `shape`: (reason, node count) pairs, most common first, then by reason (kept until the
        table changes: many pending jobs of one shape ask in a row). Nodes in `excluded` that could take the shape
        count as reserved; one that could not keeps its own reason, the one that holds with or without reservations
        (an 8-GPU task is told its node has too few GPUs, not that the node is reserved)."""
        entry = self._resolved(table, shape, self._current(table, shape))
        if entry.explained_at != table.seq:
            entry.explained, entry.explained_at = _reasons(entry.scores, self._reasons), table.seq
        reserved = sum(1 for i in excluded if int(entry.scores[i]) >= FEASIBLE_MIN)
        if not reserved:
            return list(entry.explained)
        counts = dict(entry.explained)
        counts[RESERVED] = counts.get(RESERVED, 0) + reserved
        return sorted(((r, n) for r, n in counts.items() if n), key=lambda kv: (-kv[1], kv[0]))


def _reasons(scores: np.ndarray, names: list[str]) -> list[tuple[str, int]]:
    """(reason, count) over the rejected entries of `scores`, most common first, then by reason."""
    counts = np.bincount(scores[scores < FEASIBLE_MIN] - INFEASIBLE)
    pairs = [(names[int(i)], int(counts[i])) for i in np.flatnonzero(counts)]
    return sorted(pairs, key=lambda kv: (-kv[1], kv[0]))
