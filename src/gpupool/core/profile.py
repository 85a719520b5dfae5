"""The named profiles gpupool ships: placement policies (`PLACEMENT_PROFILES`) and multi-tenant scheduling profiles
(`SCHEDULING_PROFILES`), as `Profile` values (`gpupool.core.framework.runtime`) that name in-tree actions and plugins.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gpupool.core.framework.interfaces import DevicePlugin, QueueOrderPlugin, ScorePlugin, VictimPlugin
from gpupool.core.framework.placement import TieBreak
from gpupool.core.framework.registry import Registry
from gpupool.core.framework.runtime import Profile


def _placement(name: str, score: str, devices: str, tie_break: TieBreak = "name") -> Profile:
    return Profile(name=name, scores=((score, 1),), devices=devices, tie_break=tie_break)


#: The placement policies of ALGORITHMS.md §2 (plus spread), each as a one-score profile.
PLACEMENT_PROFILES: dict[str, Profile] = {
    "random": _placement("random", "random", "random_gpu", "random"),
    "dotprod": _placement("dotprod", "dotprod", "best_fit"),
    "gpuclustering": _placement("gpuclustering", "gpuclustering", "best_fit"),
    "gpupacking": _placement("gpupacking", "gpupacking", "best_fit"),
    "bestfit": _placement("bestfit", "bestfit", "best_fit"),
    "fgd": _placement("fgd", "fgd", "fgd"),
    "spread": _placement("spread", "spread", "worst_fit"),
    "strand_aware": _placement("strand_aware", "strand_aware", "strand_aware"),
}
#: gpupool's recommended placement policy, selectable as `best`.
PLACEMENT_PROFILES["best"] = _placement("best", "strand_aware", "strand_aware")


#: Multi-tenant profiles: queue order, actions, and arguments per action or plugin; placement is chosen
#: separately.
SCHEDULING_PROFILES: dict[str, tuple[str, tuple[str, ...], dict[str, dict[str, Any]]]] = {
    "fifo": ("fifo", ("allocate",), {}),
    "priority": ("priority", ("allocate", "preempt"), {}),
    "drf": ("drf", ("allocate", "reclaim"), {}),
    # Enforces shares by reclaim across queues and preemption inside them; EASY reservations keep gangs from
    # starving behind the jobs that evictions start. Reclaim uses both of KAI's strategies, so a queue within its
    # guaranteed quota gets it back even when idle pieces leave every queue short of its fair share, with up to
    # 64 victims a cycle so that a gang of whole nodes can be freed (README replay: inference's 40-GPU gang
    # starts 11,300 s sooner, its window goes from -13.2 % to -3.7 %, and the worst window from 13.2 % to 11.8 %).
    # A job that has waited two hours may restart tasks elsewhere to free a node, if their restarts lose no more
    # GPU-time than it has lost waiting (on the same replay, vision's 8-GPU jobs, starved in the drain by long small
    # tasks that no reclaim may take, start by t = 109,521 s instead of 141,000 s: worst window 11.8 % -> 7.9 %).
    "fair-share": ("fair_share", ("allocate", "reclaim", "preempt", "consolidate"),
                   {"allocate": {"backfill": "easy", "max_reservations": 2, "reserve_after_s": 7200.0},
                    "reclaim": {"guarantee_deserved_quota": True, "max_victims": 64},
                    "consolidate": {"min_wait_s": 7200.0, "max_lost_work_s": math.inf, "lost_work_within_wait": True}}),
    # gpupool's recommendation: fair share as an order (Slurm-style), not by eviction: queues below their
    # fair share go first; inside a queue jobs go by expected end (submission + estimate), and a job that has
    # waited a quarter of its own estimate goes before every job that has not, whatever their priorities
    # (`overdue_first`, `overdue_after`), so higher-priority and shorter jobs pass it only for that long (on the
    # README's replay, a quarter instead of the whole estimate cut the jobs later than under fifo by more than
    # their estimate from 145 to 45 and the mean wait from 569 to 534 s); gangs are protected by
    # EASY reservations (the first two blocked jobs, and up to two per queue for jobs waiting over two hours)
    # with backfill around them; best placement. No eviction at all: on the openb 4-queue replay at load 1.2,
    # reclaim threw away 1,500 GPU-hours of research work (918 evictions) and preemption inside a queue
    # cascaded, and the lost work more than doubled the mean wait (README, "Tenants in the simulator").
    # `fair-share` is the profile that enforces shares by reclaim and preemption.
    "default": ("fair_share", ("allocate",),
                {"allocate": {"backfill": "easy", "max_reservations": 2, "reserve_after_s": 7200.0},
                 "fair_share": {"job_order": "expected_end", "overdue_first": True, "overdue_after": 0.25}}),
}


def scheduling_profile(name: str, placement: str = "best", registry: Registry | None = None) -> Profile:
    """A multi-tenant profile using the placement policy `placement`.

    `name` is an in-tree profile (`SCHEDULING_PROFILES`), optionally followed by `+plugin` parts, each a plugin of
    `registry` swapped in at the extension point it implements: a queue order, a victim order or a score (which
    replaces the profile's placement). A bare plugin name is `fifo+plugin`. So `fair-share+my_victims` is fair-share
    evicting in `my_victims`' order."""
    base, *extra = name.split("+")
    if base not in SCHEDULING_PROFILES and _registered(registry, base) is not None:
        base, extra = "fifo", [base, *extra]
    if base not in SCHEDULING_PROFILES:
        raise ValueError(f"profile: unknown {name!r}; choose from {', '.join(SCHEDULING_PROFILES)}, a plugin "
                         "name or PROFILE+PLUGIN")
    order, actions, args = SCHEDULING_PROFILES[base]
    profile = placement_profile(placement, registry)
    profile = replace(profile, name=name, queue_order=order, actions=actions, args={**profile.args, **args})
    for plugin in extra:
        profile = _swapped_in(profile, plugin, registry)
    return profile


def _registered(registry: Registry | None, name: str) -> type | None:
    """The class registered as plugin `name`, if any."""
    factory = registry.plugins.get(name) if registry is not None else None
    return factory if isinstance(factory, type) else None


def _swapped_in(profile: Profile, plugin: str, registry: Registry | None) -> Profile:
    factory = _registered(registry, plugin)
    if factory is not None and issubclass(factory, QueueOrderPlugin):
        return replace(profile, queue_order=plugin)
    if factory is not None and issubclass(factory, VictimPlugin):
        return replace(profile, victims=plugin)
    if factory is not None and issubclass(factory, ScorePlugin):
        return replace(profile, scores=((plugin, 1),), devices=plugin if issubclass(factory, DevicePlugin)
                       else "best_fit")
    raise ValueError(f"profile {profile.name}: {plugin!r} is not a registered queue-order, victim or score plugin")


def placement_profile(policy: str, registry: Registry | None = None) -> Profile:
    """An in-tree placement policy (`PLACEMENT_PROFILES`), or a score plugin of `registry` by its name (it picks
    devices too if it is also a device plugin; otherwise best fit)."""
    if policy in PLACEMENT_PROFILES:
        return PLACEMENT_PROFILES[policy]
    factory = _registered(registry, policy)
    if factory is not None and issubclass(factory, ScorePlugin):
        return _placement(policy, policy, policy if issubclass(factory, DevicePlugin) else "best_fit")
    raise ValueError(f"policy: unknown {policy!r}; choose from {', '.join(PLACEMENT_PROFILES)} or an installed "
                     "score plugin (entry-point group gpupool.plugins)")
