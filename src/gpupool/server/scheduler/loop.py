"""SchedulerLoop: snapshot -> the same `core.run_cycle` as the simulator -> binder, on a worker thread.

A cycle runs every `cycle_interval_s`, and at once when woken (a submission, a release, a node change).
Each cycle: 1. hold the lease (on a takeover, `on_takeover` first reloads what another leader may have
changed); 2. read the pending jobs (loading only those new since the last cycle: scheduler/pending.py) and the
queue tree; 3. run the core on the cache's snapshot under the cache lock; 4. bind, fenced by the lease's epoch;
5. record why each still-pending job waits; 6. update metrics. With a Kubernetes backend (server/kube), step 2 also
takes its nodes, bound pods and pending pods into the cache and the cycle, and steps 4-5 send the decisions and
reasons about pods to it; one cycle schedules agents' jobs and pods together.
While the database is unreachable the loop keeps trying, with one warning per `QUIET_S`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from gpupool.core import Bind, Decision, Evict, Framework, Workload, installed_registry, run_cycle, scheduling_profile
from gpupool.core.decisions import Move
from gpupool.core.diagnostics import PendingKind, PendingReason
from gpupool.core.model import TaskShape
from gpupool.server.db.engine import Database, unreachable
from gpupool.server.db.repositories import QueueIndex, pending_rows
from gpupool.server.failpoints import failpoint
from gpupool.server.scheduler.binder import Binder
from gpupool.server.scheduler.cache import POD_PREFIX, ClusterCache
from gpupool.server.scheduler.lease import Fenced, SchedulerLease
from gpupool.server.scheduler.pending import Pending, PendingJobs
from gpupool.server.services.metering import exhausted_hard_budgets

if TYPE_CHECKING:
    from gpupool.server.kube.backend import KubeBackend

BUDGET_REFRESH_S = 5.0
#: The least time between two cycles, so that many wake-ups (a burst of submissions) make one cycle.
MIN_GAP_S = 0.05
#: At most one warning per this many seconds while the database cannot be reached.
QUIET_S = 10.0

log = logging.getLogger(__name__)

#: The placement's target workload until the cluster has history: common shapes, 8 CPUs per GPU.
GENERIC_SHAPES = [TaskShape(8000 * max(1, n), 16384, n, m) for n, m in
                  [(1, 1000)] * 4 + [(1, 500)] * 2 + [(1, 200), (2, 1000), (4, 1000), (8, 1000)]] + [
    TaskShape(4000, 8192)]


class WallClock:
    def now(self) -> float:
        return time.time()


class SchedulerLoop:
    def __init__(self, db: Database, cache: ClusterCache, binder: Binder, lease: SchedulerLease, profile: str,
                 placement: str, interval_s: float, metrics: Any = None) -> None:
        self.db, self.cache, self.binder, self.lease = db, cache, binder, lease
        workload = Workload.from_shapes(GENERIC_SHAPES)
        registry = installed_registry()  # plugins of the gpupool.plugins entry points too
        chosen = scheduling_profile(profile, placement, registry)
        self.framework = Framework.build(chosen.with_workload(workload), registry)
        log.info("scheduling profile %s: queue order %s, scores %s, devices %s, victims %s", chosen.name,
                 chosen.queue_order, ",".join(n for n, _ in chosen.scores), chosen.devices, chosen.victims)
        self.interval_s = interval_s
        self.metrics = metrics
        self.clock, self.rng = WallClock(), random.Random(0)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
        self._reasons: dict[str, PendingReason] = {}
        self._pending = PendingJobs()
        #: GPU-unit fair share per queue from the latest cycle (read by the queues API and metrics)
        self.fair_shares: dict[str, int] = {}
        self._budgets: dict[tuple[str, str], str] = {}
        self._budgets_at = float("-inf")
        self.cycles = 0
        #: called on the scheduler thread when this process takes the lease over (a new epoch)
        self.on_takeover: Callable[[], None] | None = None
        self._epoch = 0
        self._warned_at = float("-inf")
        #: a Kubernetes cluster whose pods this loop schedules too (server/kube), if the server has a kubeconfig
        self.backend: KubeBackend | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        self.lease.release()

    def wake(self) -> None:
        self._wake.set()

    def budgets_changed(self) -> None:
        """A budget was changed or deleted: read the hard budgets afresh in the next cycle (which this wakes), so
        that undoing one lets the jobs it held start at once."""
        self._budgets_at = float("-inf")
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            time.sleep(min(MIN_GAP_S, self.interval_s))  # let a burst of submissions land in one cycle
            self._wake.clear()
            try:
                if self.lease.hold():
                    self._took_over()
                    self.cycle_once()
            except Fenced:
                pass  # deposed while in the cycle: the lease said so in the log
            except Exception as exc:
                self._failed(exc)

    def _took_over(self) -> None:
        """Run `on_takeover` once per new epoch of this process's leadership (the first one included)."""
        if self.lease.epoch != self._epoch:
            if self.on_takeover is not None:
                self.on_takeover()
            self._reasons = {}  # another leader may have written them since: write them all again
            self._pending.forget()
            self._epoch = self.lease.epoch

    def _failed(self, exc: Exception) -> None:
        """Log a failed cycle: an unreachable database at most once per QUIET_S, anything else (a bug) in full."""
        if not unreachable(exc):
            log.exception("scheduler cycle failed")
        elif time.monotonic() - self._warned_at > QUIET_S:
            self._warned_at = time.monotonic()
            log.warning("scheduler: database unreachable, retrying: %s", str(exc).splitlines()[0][:200])

    def cycle_once(self) -> int:
        with self.db.session() as session:
            pending = self._pending.read(session)
            queues = QueueIndex.load(session)
            held = self._over_budget(session, pending)
        specs = {p.spec.id: p.spec for p in pending if p.spec.id not in held}
        kube = self.backend.prepare(self.cache, queues) if self.backend is not None else None
        if kube is not None:
            specs.update(kube.pending.jobs)
        started = time.perf_counter()
        with self.cache.lock:
            snapshot = self.cache.snapshot(tuple(specs.values()), self.clock.now(), queues.tree())
            result = run_cycle(snapshot, self.framework, clock=self.clock, rng=self.rng)
        seconds = time.perf_counter() - started
        if result.decisions:
            failpoint("scheduler.before_bind")
        ours = [d for d in result.decisions if not _is_pod(d)]
        placed = self.binder.apply(ours, specs, self.lease.epoch)
        waiting = {**result.pending, **held}
        if kube is not None and self.backend is not None:
            placed += self.backend.apply(result.decisions, kube, self.cache)
            self.backend.record({j: r for j, r in result.pending.items() if j in kube.pending.jobs}, kube,
                                self.lease.epoch)
            waiting = {j: r for j, r in waiting.items() if not j.startswith(POD_PREFIX)}
        self._record_reasons(waiting, self.lease.epoch)
        self.fair_shares = dict(result.fair_shares)
        self.cache.reserved_milli = result.reserved_milli
        self.cycles += 1
        if self.metrics is not None:
            self.metrics.observe_cycle(seconds, len(result.decisions), result.fair_shares,
                                       [p.spec.queue for p in pending if p.spec.id in waiting])
        return placed

    def _over_budget(self, session: Session, pending: list[Pending]) -> dict[str, PendingReason]:
        """Pending jobs of projects or queues whose hard budget is spent: held back, with the reason."""
        now = time.monotonic()
        if now - self._budgets_at > BUDGET_REFRESH_S:
            self._budgets = exhausted_hard_budgets(session, datetime.now(UTC))
            self._budgets_at = now
        if not self._budgets:
            return {}
        held = {}
        for p in pending:
            why = self._budgets.get(("project", p.project_id)) or self._budgets.get(("queue", p.spec.queue))
            if why:
                held[p.spec.id] = PendingReason(PendingKind.BUDGET_EXHAUSTED, why)
        return held

    def _record_reasons(self, pending: dict[str, PendingReason], epoch: int) -> None:
        changed = {j: r for j, r in pending.items() if self._reasons.get(j) != r}
        self._reasons = dict(pending)
        if not changed:
            return
        with self.db.session() as session:
            self.lease.fence(session, epoch)
            for row in pending_rows(session, list(changed)):  # one query, not one per job
                row.reason = changed[row.id].to_dict()


def _is_pod(decision: Decision) -> bool:
    """Whether a decision is about a Kubernetes pod (the backend applies it, not the binder)."""
    if isinstance(decision, Bind):
        return decision.job_id.startswith(POD_PREFIX)
    return isinstance(decision, Evict | Move) and decision.task_id.startswith(POD_PREFIX)
