"""A registry is a value: name -> factory. `gpupool.core.registry.default_registry()` builds a fresh one holding the
in-tree actions and plugins; nothing registers itself at import time. `load_entry_points` merges out-of-tree plugins
by an explicit call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from gpupool.core.framework.action import Action
from gpupool.core.framework.interfaces import Plugin

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
        plugin = _create("plugin", self.plugins, name, args)
        assert isinstance(plugin, Plugin)
        return plugin

    def create_action(self, name: str, args: Mapping[str, Any]) -> Action:
        action = _create("action", self.actions, name, args)
        assert isinstance(action, Action)
        return action


def _create(kind: str, table: Mapping[str, Any], name: str, args: Mapping[str, Any]) -> Any:
    """`table[name](**args)`; ValueError naming the `kind` for an unknown name or arguments its factory refuses."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    try:
        return table[name](**args)
    except TypeError as exc:
        raise ValueError(f"{kind} {name!r}: bad arguments: {exc}") from None


def load_entry_points(registry: Registry, group: str = "gpupool.plugins") -> None:
    """Register every class published under the entry-point `group` (an explicit, opt-in call)."""
    for entry in metadata.entry_points(group=group):
        registry.register(entry.load())
