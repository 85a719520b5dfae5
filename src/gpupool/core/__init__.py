"""The pure scheduling core: snapshot in, decisions out; no I/O, no wall clock, no global randomness.

The public API, re-exported here, is what `gpupool.sim` and `gpupool.server` use.
"""

from gpupool.core.clock import Clock, FixedClock
from gpupool.core.cycle import CycleResult, run_cycle
from gpupool.core.decisions import ApplyReport, Bind, Decision, DecisionSink, Evict
from gpupool.core.diagnostics import PendingKind, PendingReason
from gpupool.core.fragmentation import FragModel, TaskClass, Workload
from gpupool.core.framework.registry import Registry
from gpupool.core.framework.runtime import WORKLOAD_AWARE, Framework, Profile
from gpupool.core.model import DeviceShare, GpuDevice, JobSpec, NodeSpec, TaskShape, TaskSpec
from gpupool.core.nodes import NodeKind, NodeState, NodeTable
from gpupool.core.profile import PLACEMENT_PROFILES, SCHEDULING_PROFILES, placement_profile, scheduling_profile
from gpupool.core.queues import QueueSpec, QueueTree
from gpupool.core.registry import default_registry, installed_registry
from gpupool.core.resources import ResourceVector
from gpupool.core.snapshot import ClusterSnapshot, RunningTask

__all__ = [
    "ApplyReport",
    "Bind",
    "Clock",
    "ClusterSnapshot",
    "CycleResult",
    "Decision",
    "DecisionSink",
    "DeviceShare",
    "Evict",
    "FixedClock",
    "FragModel",
    "Framework",
    "GpuDevice",
    "JobSpec",
    "NodeKind",
    "NodeSpec",
    "NodeState",
    "NodeTable",
    "PLACEMENT_PROFILES",
    "PendingKind",
    "PendingReason",
    "Profile",
    "QueueSpec",
    "QueueTree",
    "Registry",
    "ResourceVector",
    "RunningTask",
    "SCHEDULING_PROFILES",
    "TaskClass",
    "TaskShape",
    "TaskSpec",
    "WORKLOAD_AWARE",
    "Workload",
    "default_registry",
    "installed_registry",
    "placement_profile",
    "run_cycle",
    "scheduling_profile",
]
