"""Expected outcomes of plugins as values (exceptions are for bugs).

The codes follow the Kubernetes scheduler framework; the comment on each says what the caller does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    SUCCESS = 0
    #: might fit after preemption or reclaim: the caller may try victims on this node
    UNSCHEDULABLE = 1
    #: no eviction can help here: the caller skips this node for preemption too
    UNRESOLVABLE = 2
    #: not now, try again next cycle (e.g. a reservation or a gang still gathering)
    WAIT = 3
    #: this plugin does not apply; the caller ignores it
    SKIP = 4
    #: unexpected input; the caller records it and treats the job as unschedulable
    ERROR = 5


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reason: str = ""
    plugin: str = ""

    @property
    def is_success(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def is_rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNRESOLVABLE, Code.ERROR)


OK = Status(Code.SUCCESS)
