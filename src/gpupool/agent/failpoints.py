"""Failpoints of the agent: named places where a test makes the agent fail, as gpupool.server.failpoints does for
the control plane (RELIABILITY.md §3.0). Armed only by the environment, when the channel is made::

    GPUPOOL_AGENT_FAILPOINTS="agent.launch=error@1"

Each entry is `NAME=error[@N]`: raise `FailpointError` at every hit of NAME, or only at its N-th (N >= 1). Unknown
names and malformed entries are refused with a message naming the entry (the agent exits at start), so a typo never
silently tests nothing. An unarmed failpoint costs one dict lookup.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

ENV = "GPUPOOL_AGENT_FAILPOINTS"

#: every place that calls `Failpoints.hit`, with where it sits
NAMES: dict[str, str] = {
    "agent.launch": "workloads: a launch order checked and about to be started by the runtime",
}

_ENTRY = re.compile(r"^(?P<name>[a-z_.]+)=error(?:@(?P<nth>[1-9]\d*))?$")


class FailpointError(ValueError):
    """Raised by an armed failpoint: an injected failure. A ValueError, as the runtime's own for a bad launch (an
    embedded NUL) is."""


class Failpoints:
    """The failpoints armed in one agent: name -> the hit that fails (0: every hit), and the hits so far."""

    def __init__(self, armed: Mapping[str, int] | None = None) -> None:
        self._armed = dict(armed or {})
        self._hits: dict[str, int] = {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Failpoints:
        """The failpoints `environ[ENV]` arms; ValueError naming the first bad entry."""
        armed: dict[str, int] = {}
        for raw in (part.strip() for part in environ.get(ENV, "").split(",")):
            if not raw:
                continue
            match = _ENTRY.match(raw)
            if match is None:
                raise ValueError(f"{ENV}: bad entry {raw!r}: expected NAME=error[@N]")
            if match["name"] not in NAMES:
                raise ValueError(f"{ENV}: unknown failpoint {match['name']!r}; known: {', '.join(sorted(NAMES))}")
            armed[match["name"]] = int(match["nth"] or 0)
        return cls(armed)

    def hit(self, name: str) -> None:
        """`name` is reached: raise FailpointError when it is armed for this hit."""
        nth = self._armed.get(name)
        if nth is None:
            return
        self._hits[name] = hit = self._hits.get(name, 0) + 1
        if nth in (0, hit):
            raise FailpointError(f"failpoint {name}: injected error (hit {hit})")
