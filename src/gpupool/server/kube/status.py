"""Why a pod waits, written back to it as kube-scheduler does: the PodScheduled=False condition (reason
Unschedulable, gpupool's reason as its message) whenever the reason changes, and a FailedScheduling Warning event
at once when the reason changes, then again after EVENT_EVERY_S, twice that, ... up to EVENT_MAX_S while it stays
(kube-scheduler's backoff, so that thousands of waiting pods do not flood the apiserver with events).

The writes run on a pool of threads: two writes for one pod are serialised (a lock per pod's stripe), and a write
whose reason is no longer the pod's latest is dropped, so a pod always ends with its latest reason, whatever order
the threads run in."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from gpupool.core import PendingReason
from gpupool.server.kube.objects import KubePod

if TYPE_CHECKING:
    from gpupool.server.kube.client import KubeClient

log = logging.getLogger(__name__)

EVENT_EVERY_S = 60.0
EVENT_MAX_S = 3600.0


def message(reason: PendingReason) -> str:
    return f"gpupool: {reason.kind.value}: {reason.message}"


class StatusWriter:
    def __init__(self, client: KubeClient, pool: Executor) -> None:
        self.client, self.pool = client, pool
        self._written: dict[str, tuple[str, float, float]] = {}  # pod uid -> (message, last event, next wait)
        self._stripes = [threading.Lock() for _ in range(64)]

    def record(self, pods: list[KubePod], reason: PendingReason) -> None:
        """Write `reason` on each of `pods` where it is new, or its last event is old (asynchronously)."""
        text, now = message(reason), time.monotonic()
        for pod in pods:
            last = self._written.get(pod.uid)
            if last is not None and last[0] == text and now - last[1] < last[2]:
                continue
            changed = last is None or last[0] != text
            wait = EVENT_EVERY_S if last is None or changed else min(2 * last[2], EVENT_MAX_S)
            self._written[pod.uid] = (text, now, wait)
            self.pool.submit(self._write, pod, text, changed)

    def _write(self, pod: KubePod, text: str, changed: bool) -> None:
        with self._stripes[hash(pod.uid) % len(self._stripes)]:
            latest = self._written.get(pod.uid)
            if latest is not None and latest[0] == text:  # else a newer reason was recorded: its write follows
                self._apply(pod, text, changed)

    def _apply(self, pod: KubePod, text: str, changed: bool) -> None:
        try:
            if changed:
                self.client.unschedulable(pod.namespace, pod.name, text)
            self.client.event(pod.namespace, pod.name, pod.uid, "FailedScheduling", text)
        except Exception as exc:  # the pod went meanwhile (404), the apiserver is away: the next cycle writes again
            self._written.pop(pod.uid, None)
            log.info("kube: could not write why %s waits: %s", pod.key, str(exc).splitlines()[0][:200])

    def forget(self, live: set[str]) -> None:
        """Drop what was written for pods no longer pending (uids not in `live`)."""
        self._written = {uid: w for uid, w in self._written.items() if uid in live}
