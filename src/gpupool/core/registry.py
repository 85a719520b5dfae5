"""A registry is a value: name -> factory, built fresh by `default_registry()`; nothing registers
itself at import time. `load_entry_points` merges out-of-tree plugins by an explicit call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from gpupool.core.actions.allocate import AllocateAction
from gpupool.core.actions.consolidate import ConsolidateAction
from gpupool.core.actions.preempt import PreemptAction
from gpupool.core.actions.reclaim import ReclaimAction
from gpupool.core.framework import Action, Plugin
from gpupool.core.plugins.devices.best_fit import BestFitDevices
from gpupool.core.plugins.devices.random_gpu import RandomDevices
from gpupool.core.plugins.devices.worst_fit import WorstFitDevices
from gpupool.core.plugins.filter.gpu_fit import GpuFitFilter
from gpupool.core.plugins.queue_order.drf import DrfQueueOrder
from gpupool.core.plugins.queue_order.fair_share import FairShareQueueOrder
from gpupool.core.plugins.queue_order.fifo import FifoQueueOrder
from gpupool.core.plugins.queue_order.priority import PriorityQueueOrder
from gpupool.core.plugins.score.bestfit import BestFitScore
from gpupool.core.plugins.score.dotprod import DotProdScore
from gpupool.core.plugins.score.fgd import FgdPolicy
from gpupool.core.plugins.score.gpuclustering import GpuClusteringScore
from gpupool.core.plugins.score.gpupacking import GpuPackingScore
from gpupool.core.plugins.score.random import RandomScore
from gpupool.core.plugins.score.spread import SpreadScore
from gpupool.core.plugins.score.strand_aware import StrandAwarePolicy
from gpupool.core.plugins.victims.least_work import LeastWorkVictims

Factory = Callable[..., Any]


class Registry:
    def __init__(self) -> None:
        self.plugins: dict[str, Factory] = {}
        self.actions: dict[str, Factory] = {}

    def register(self, factory: type[Plugin] | type[Action]) -> None:
        """Register a plugin or action class under its `name`; a duplicate name raises."""
        table = self.actions if issubclass(factory, Action) else self.plugins
        if factory.name in table:
            raise ValueError(f"{factory.name!r} is already registered")
        table[factory.name] = factory

    def merge(self, other: Registry) -> None:
        for table, theirs in ((self.plugins, other.plugins), (self.actions, other.actions)):
            for name, factory in theirs.items():
                if name in table:
                    raise ValueError(f"{name!r} is already registered")
                table[name] = factory

    def create_plugin(self, name: str, args: Mapping[str, Any]) -> Plugin:
        if name not in self.plugins:
            raise ValueError(f"unknown plugin {name!r}; known: {', '.join(sorted(self.plugins))}")
        try:
            plugin = self.plugins[name](**args)
        except TypeError as exc:
            raise ValueError(f"plugin {name!r}: bad arguments: {exc}") from None
        assert isinstance(plugin, Plugin)
        return plugin

    def create_action(self, name: str, args: Mapping[str, Any]) -> Action:
        if name not in self.actions:
            raise ValueError(f"unknown action {name!r}; known: {', '.join(sorted(self.actions))}")
        try:
            action = self.actions[name](**args)
        except TypeError as exc:
            raise ValueError(f"action {name!r}: bad arguments: {exc}") from None
        assert isinstance(action, Action)
        return action


_IN_TREE: tuple[type[Plugin] | type[Action], ...] = (
    AllocateAction, ConsolidateAction, PreemptAction, ReclaimAction,
    GpuFitFilter,
    FifoQueueOrder, PriorityQueueOrder, DrfQueueOrder, FairShareQueueOrder, LeastWorkVictims,
    BestFitDevices, WorstFitDevices, RandomDevices,
    RandomScore, BestFitScore, DotProdScore, GpuPackingScore, GpuClusteringScore, FgdPolicy, SpreadScore,
    StrandAwarePolicy,
)


def default_registry() -> Registry:
    """A new registry holding every in-tree action and plugin."""
    registry = Registry()
    for factory in _IN_TREE:
        registry.register(factory)
    return registry


def load_entry_points(registry: Registry, group: str = "gpupool.plugins") -> None:
    """Register every class published under the entry-point `group` (an explicit, opt-in call)."""
    for entry in metadata.entry_points(group=group):
        registry.register(entry.load())
