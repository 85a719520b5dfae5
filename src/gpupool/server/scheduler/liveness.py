"""When may the control plane declare a node lost? The CP-impaired guard and the requeue rate (RELIABILITY.md §2.2).

A silent node is usually a dead or partitioned node, but sometimes the silence is the control plane's own
doing. The guard holds every LOST transition while the control plane is impaired, that is:

1. within `lost_after_s` (G) of its start or of its takeover of the scheduler lease: agents get a fresh
   grace G counted from the moment this process is in charge (it did not hear them before);
2. within G of the database last being unreachable (reports could not be applied, agents could not
   reconnect; `Database.unreachable_at`);
3. while more than `impaired_silent_share` of the tracked nodes (at least `MIN_NODES`) are silent past
   `suspect_after_s` at once: a mass disappearance is more likely the network next to the control plane
   than that many nodes failing together (Kubernetes' unhealthy-zone threshold 0.55).

Outside the guard, LOST transitions (each requeues the node's jobs) pass a token bucket of
`requeue_rate_per_s` with burst `requeue_burst` (Kubernetes' node-eviction-rate), so a wave of losses below
the threshold still requeues at a bounded pace. Pure: every method takes the monotonic time `now`.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.server.settings import Settings

#: Below this many tracked nodes the silent-share rule does not apply (one node of two is not "most").
MIN_NODES = 3


class LivenessGuard:
    """See the module docstring. `reason` is why the guard holds now ("" when it does not), as of the latest
    `check`; `engaged` says whether it holds."""

    def __init__(self, settings: Settings, now: float) -> None:
        self.settings = settings
        self.started = now
        self.reason = "starting"
        self._tokens = float(settings.requeue_burst)
        self._filled_at = now

    @property
    def engaged(self) -> bool:
        return bool(self.reason)

    def restart(self, now: float) -> None:
        """This process just took charge (start or lease takeover): hold LOST transitions for G from `now`."""
        self.started = now
        self.reason = "starting"

    def check(self, now: float, quiet: Mapping[str, float], db_unreachable_at: float) -> str:
        """Update and return `reason`, given each tracked node's seconds of silence and when the database
        was last unreachable (monotonic)."""
        grace = self.settings.lost_after_s
        silent = sum(q > self.settings.suspect_after_s for q in quiet.values())
        if now - self.started < grace:
            self.reason = "starting"
        elif now - db_unreachable_at < grace:
            self.reason = "database unreachable"
        elif len(quiet) >= MIN_NODES and silent > self.settings.impaired_silent_share * len(quiet):
            self.reason = f"{silent} of {len(quiet)} nodes silent at once"
        else:
            self.reason = ""
        return self.reason

    def allow_lost(self, now: float) -> bool:
        """Take one token for a LOST transition; False (try again later) when the guard holds or the bucket
        is empty."""
        rate, burst = self.settings.requeue_rate_per_s, float(self.settings.requeue_burst)
        self._tokens = min(burst, self._tokens + (now - self._filled_at) * rate)
        self._filled_at = now
        if self.engaged or self._tokens < 1:
            return False
        self._tokens -= 1
        return True
