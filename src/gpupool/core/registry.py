"""The in-tree registry: `default_registry()` builds a fresh `Registry` value holding every action and plugin that
ships with gpupool (the one place that names them all). Nothing registers itself at import time."""

from __future__ import annotations

from gpupool.core.actions.allocate import AllocateAction
from gpupool.core.actions.consolidate import ConsolidateAction
from gpupool.core.actions.preempt import PreemptAction
from gpupool.core.actions.reclaim import ReclaimAction
from gpupool.core.framework.action import Action
from gpupool.core.framework.interfaces import Plugin
from gpupool.core.framework.registry import Registry, load_entry_points
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


def installed_registry() -> Registry:
    """`default_registry()` plus every plugin installed under the entry-point group `gpupool.plugins` (docs:
    Writing a plugin). It reads package metadata: the simulator and the server call it when they build a profile,
    never inside a cycle."""
    registry = default_registry()
    load_entry_points(registry)
    return registry
