"""The scheduler's cache follows the nodes' rows (Draining.follow), but never undoes a change made after its read:
a cordon committed between a pass's read and its apply once let a stale "schedulable" win, and a job went to the
cordoned node (seen as a partition test whose attempt 1 landed on the wrong node)."""

from __future__ import annotations

from gpupool.core.model import NodeSpec
from gpupool.server.scheduler.cache import ClusterCache, NodeEntry


def _cache(*names: str) -> ClusterCache:
    cache = ClusterCache()
    cache.set_nodes([NodeEntry(f"id-{name}", NodeSpec(name, 8000, 8192), []) for name in names])
    return cache


def _schedulable(cache: ClusterCache, name: str) -> bool:
    return cache.table.states[cache.table.index[name]].schedulable


def test_rows_read_before_a_cordon_do_not_undo_it() -> None:
    cache = _cache("a", "b")
    read_after = cache.schedulable_changes
    rows = {"a": True, "b": True}  # read from the database before the cordon of b committed
    cache.set_schedulable("b", False)  # the cordon: committed, then the cache
    assert not cache.follow_rows(rows, read_after)
    assert not _schedulable(cache, "b") and cache.nodes["b"].schedulable is False


def test_rows_read_after_every_change_are_taken() -> None:
    cache = _cache("a", "b")
    cache.set_schedulable("b", False)
    read_after = cache.schedulable_changes
    assert cache.follow_rows({"a": False, "b": True}, read_after)  # a cordoned by another control plane, b undone
    assert not _schedulable(cache, "a") and _schedulable(cache, "b")
