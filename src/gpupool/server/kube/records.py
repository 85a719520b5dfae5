"""gpupool's pods as rows of its database (services/pod_jobs.py), written off the bind path.

Each cycle the backend hands `PodRecorder.offer` what it sees of its pods (`records_of`: pure) with why each
pending one waits; one writer thread writes what changed since its last write, in one transaction, and takes the
next offer when done (offers that arrive meanwhile replace each other: only the latest view matters). A bind never
waits for the database. The writer remembers what it wrote; on start (or after a failed write) it resumes from the
rows themselves, so a restarted scheduler records each pod once. Pods it has rows for that are gone from the
cluster end as deleted. Its transaction is fenced by the scheduler lease's epoch, as every scheduler write is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from gpupool.server.db.engine import Database
from gpupool.server.kube.objects import KubeNode, KubePod, Malformed, devices_of, shape_of
from gpupool.server.kube.view import task_id
from gpupool.server.services import pod_jobs
from gpupool.server.services.pod_jobs import PodRecord

log = logging.getLogger(__name__)

PHASES = {"Pending": "scheduled", "Running": "running", "Succeeded": "succeeded", "Failed": "failed"}
NODE_GONE = {"kind": "node_gone", "message": "its node left the cluster", "details": []}


def records_of(pods: Iterable[KubePod], nodes: dict[str, KubeNode], reasons: dict[str, dict[str, Any]],
               queue_of: Callable[[KubePod], str]) -> list[PodRecord]:
    """What the database should say of each of gpupool's pods; `reasons`: why each pending one waits, by pod uid;
    `queue_of`: the name of a pod's queue."""
    out = []
    for pod in pods:
        if pod.ours:
            out.append(_record(pod, nodes.get(pod.node), reasons.get(pod.uid), queue_of(pod)))
    return out


def _record(pod: KubePod, node: KubeNode | None, reason: dict[str, Any] | None, queue: str) -> PodRecord:
    try:
        shape = shape_of(pod)
        count, milli = shape.gpu_count, shape.gpu_milli
    except Malformed:
        count = milli = 0
    total = count * milli
    state, why = "pending", reason
    if pod.node:
        state, why = PHASES.get(pod.phase, "running"), None
        if node is None and not pod.done:
            state, why = "failed", NODE_GONE
    gpus = len(node.spec.gpus) if node is not None else 0
    shares = tuple((s.index, s.milli) for s in devices_of(pod, gpus) or ()) if pod.node else ()
    model = node.spec.gpus[0].model if node is not None and node.spec.gpus else ""
    return PodRecord(task_id(pod), pod.namespace, pod.name, queue, state, f"{total / 1000:g}", pod.cpu_milli,
                     pod.memory_mib, total, pod.priority, pod.created, pod.node, shares, model, pod.bound_at,
                     pod.started_at, pod.finished_at, why)


class PodRecorder:
    """Writes the latest offered view of the pods on its own thread (see the module docstring)."""

    def __init__(self, db: Database, fence: Callable[[Session, int], None] | None, org: str) -> None:
        self.db, self.fence, self.org = db, fence, org
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kube-records")
        self._lock = threading.Lock()
        self._next: tuple[dict[str, KubePod], dict[str, KubeNode], dict[str, dict[str, Any]],
                          Callable[[KubePod], str], int] | None = None
        self._busy = False
        self._written: dict[str, PodRecord] = {}
        self._open: set[str] | None = None  # external ids of rows not final; None: read them from the database
        self.writes = 0  # transactions committed (tests, metrics)

    def offer(self, pods: dict[str, KubePod], nodes: dict[str, KubeNode], reasons: dict[str, dict[str, Any]],
              queue_of: Callable[[KubePod], str], epoch: int) -> None:
        """The cluster as a cycle saw it (every pod listed: gpupool's absent ones are gone), why each pending pod
        waits (by uid) and the name of a pod's queue; turned into records on the writer's thread."""
        with self._lock:
            self._next = (pods, nodes, reasons, queue_of, epoch)
            if self._busy:
                return
            self._busy = True
        self._pool.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if self._next is None:
                    self._busy = False
                    return
                pods, nodes, reasons, queue_of, epoch = self._next
                self._next = None
            try:
                records = records_of(pods.values(), nodes, reasons, queue_of)
                self._write(records, {r.external_id for r in records}, epoch)
            except Exception as exc:  # the database away, a deposed leader: resume from the rows next time
                log.warning("kube: could not record pods: %s", str(exc).splitlines()[0][:200])
                self._written, self._open = {}, None

    def _write(self, records: list[PodRecord], present: set[str], epoch: int) -> None:
        changed = [r for r in records if self._written.get(r.external_id) != r]
        with self.db.session() as session:
            org_id = pod_jobs.find_org(session, self.org)
            if org_id is None:
                return
            if self._open is None:
                self._open = set(pod_jobs.open_pods(session, org_id))
            gone = sorted(self._open - present)
            if not changed and not gone:
                return
            if self.fence is not None:
                self.fence(session, epoch)
            states = pod_jobs.record(session, org_id, changed, gone, datetime.now(UTC))
        self.writes += 1
        self._written.update((r.external_id, r) for r in changed)
        self._written = {i: r for i, r in self._written.items() if i in present}  # deleted pods: forgotten
        final = {i for i, s in states.items() if s in pod_jobs.FINAL}
        self._open = (self._open - set(gone) - final) | (set(states) - final)

    def stop(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
