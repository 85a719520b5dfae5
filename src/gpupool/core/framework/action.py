"""The action extension point: one pass of a cycle over the `Cycle` it is handed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from gpupool.core.framework.session import Cycle


class Action(ABC):
    """One pass of a cycle (allocate, backfill, reclaim, preempt, consolidate), least disruptive first."""

    name: ClassVar[str]

    @abstractmethod
    def execute(self, cycle: Cycle) -> None:
        """Called once per cycle in profile order. Changes go through `cycle.statement()`; committed
        decisions are collected with `cycle.emit`. Must not raise for expected outcomes."""
