"""Idle-GPU detection: a GPU whose utilization stays below a threshold for a whole window is reported idle."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.agent.clock import Clock
from gpupool.protocol.devices import GpuTelemetry

DEFAULT_IDLE_THRESHOLD_PCT = 5
DEFAULT_IDLE_WINDOW_S = 30 * 60.0


class IdleDetector:
    """Feeds on telemetry samples; `observe` returns the UUIDs idle for at least `window_s`.

    Contract: a GPU is idle when every sample since `window_s` ago (and at least one sample that old) was below
    `threshold_pct`. One sample at or above the threshold restarts its window. GPUs that disappear from the
    samples are forgotten. `in_use` UUIDs (GPUs granted to a running workload) may be passed to only report those,
    which is what idle-allocation reclaim needs; by default every GPU is considered.
    """

    def __init__(
        self, clock: Clock, *, threshold_pct: int = DEFAULT_IDLE_THRESHOLD_PCT, window_s: float = DEFAULT_IDLE_WINDOW_S
    ) -> None:
        if not 0 < threshold_pct <= 100 or window_s <= 0:
            raise ValueError("need 0 < threshold_pct <= 100 and window_s > 0")
        self._clock = clock
        self._threshold = threshold_pct
        self._window_s = window_s
        self._below_since: dict[str, float] = {}

    def observe(self, samples: Sequence[GpuTelemetry], in_use: set[str] | None = None) -> list[str]:
        """Record one sample per GPU taken now; the idle UUIDs in sample order."""
        now = self._clock.now()
        seen = {sample.uuid for sample in samples}
        for uuid in list(self._below_since):
            if uuid not in seen:
                del self._below_since[uuid]
        for sample in samples:
            if sample.utilization_pct >= self._threshold:
                self._below_since.pop(sample.uuid, None)
            else:
                self._below_since.setdefault(sample.uuid, now)
        return [s.uuid for s in samples if self._is_idle(s.uuid, now) and (in_use is None or s.uuid in in_use)]

    def _is_idle(self, uuid: str, now: float) -> bool:
        since = self._below_since.get(uuid)
        return since is not None and now - since >= self._window_s
