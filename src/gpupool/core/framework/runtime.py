"""Profiles as validated data, made concrete: `Framework.build(profile, registry)`.

`Framework.build` checks every name and argument against the registry once, so a bad profile fails before its first
cycle, never halfway through one. A plugin named in several extension points (FGD scores and picks devices) is built
once and shared. The named profiles gpupool ships are in `gpupool.core.profile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpupool.core.framework.action import Action
from gpupool.core.framework.interfaces import (
    DevicePlugin,
    FilterPlugin,
    Plugin,
    QueueOrderPlugin,
    ScorePlugin,
    VictimPlugin,
)
from gpupool.core.framework.placement import Placer, TieBreak
from gpupool.core.framework.registry import Registry
from gpupool.core.framework.session import Plugins

P = TypeVar("P", bound=Plugin)


#: Plugins that need a target workload (`args[plugin]["workload"]`); see `Profile.with_workload`.
WORKLOAD_AWARE = frozenset({"fgd", "strand_aware"})


@dataclass(frozen=True)
class Profile:
    name: str
    actions: tuple[str, ...] = ("allocate",)
    queue_order: str = "fifo"
    filters: tuple[str, ...] = ("gpu_fit",)
    scores: tuple[tuple[str, int], ...] = (("bestfit", 1),)
    devices: str = "best_fit"
    tie_break: TieBreak = "name"
    victims: str = "least_work"
    args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def workload_plugins(self) -> tuple[str, ...]:
        """The workload-aware plugins this profile uses."""
        names = {n for n, _ in self.scores} | {self.devices}
        return tuple(sorted(names & WORKLOAD_AWARE))

    def with_workload(self, workload: Any) -> Profile:
        """A copy whose workload-aware plugins all get `workload` (a `Workload`)."""
        profile = self
        for name in self.workload_plugins:
            profile = profile.with_args(name, workload=workload)
        return profile

    def with_args(self, plugin: str, **kwargs: Any) -> Profile:
        """A copy whose plugin (or action) `plugin` gets `kwargs` merged into its arguments."""
        merged = {**self.args, plugin: {**self.args.get(plugin, {}), **kwargs}}
        return replace(self, args=merged)

    def with_actions(self, *actions: str) -> Profile:
        return replace(self, actions=tuple(actions))


class Framework:
    """A profile made concrete: its actions, in order, and the plugins they call (with the placement engine)."""

    def __init__(self, profile: Profile, actions: list[Action], plugins: Plugins) -> None:
        self.profile = profile
        self.actions = actions
        self.plugins = plugins

    @classmethod
    def build(cls, profile: Profile, registry: Registry) -> Framework:
        instances: dict[str, Plugin] = {}

        def get(name: str, kind: type[P], field_name: str) -> P:
            if name not in instances:
                instances[name] = registry.create_plugin(name, profile.args.get(name, {}))
            plugin = instances[name]
            if not isinstance(plugin, kind):
                raise ValueError(f"profile {profile.name}: {field_name}: {name!r} is not a {kind.__name__}")
            return plugin

        unknown = set(profile.args) - set(registry.plugins) - set(profile.actions)
        if unknown:
            raise ValueError(f"profile {profile.name}: args: unknown plugins {sorted(unknown)}")
        placer = Placer(
            [get(n, FilterPlugin, "filters") for n in profile.filters],
            [(get(n, ScorePlugin, "scores"), w) for n, w in profile.scores],
            get(profile.devices, DevicePlugin, "devices"),
            profile.tie_break,
        )
        actions = [registry.create_action(n, profile.args.get(n, {})) for n in profile.actions]
        plugins = Plugins(get(profile.queue_order, QueueOrderPlugin, "queue_order"), placer,
                          get(profile.victims, VictimPlugin, "victims"))
        return cls(profile, actions, plugins)
