"""A per-cycle scratchpad with typed keys, clonable for what-if branches."""

from __future__ import annotations

from typing import Generic, TypeVar, cast

T = TypeVar("T")


class StateKey(Generic[T]):
    """A typed key; plugins derive the name from their own name to avoid collisions."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


class CycleState:
    """Values must be immutable, or the plugin that stores them must not mutate them after `set`."""

    def __init__(self) -> None:
        self._values: dict[StateKey[object], object] = {}

    def get(self, key: StateKey[T]) -> T | None:
        return cast("T | None", self._values.get(cast(StateKey[object], key)))

    def set(self, key: StateKey[T], value: T) -> None:
        self._values[cast(StateKey[object], key)] = value

    def clone(self) -> CycleState:
        other = CycleState()
        other._values = dict(self._values)
        return other
