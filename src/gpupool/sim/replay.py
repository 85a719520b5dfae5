"""Time-based replay: jobs arrive at their trace times, run for their trace durations, and wait in a
pending queue that every scheduling cycle retries. Cycles run after each batch of simultaneous
events (at most one per `tick_s` of virtual time), through the same `core.run_cycle`.

With a queue tree, the replay also meters every queue (GPU time received against fair share per
24-hour window, quota checks after every cycle) and feeds time-decayed usage back to the scheduler.
Jobs without a runtime estimate get one from the runtime predictor; a task still running at its
expected end has that end doubled (never past its limit). Evicted jobs go back to the queue and
restart from zero; a moved task of a checkpointable job keeps running, and a job that cannot checkpoint
starts over on its new nodes (the work lost is reported). A job that could not start even on the empty cluster
is rejected at submission (`core.feasible`): it never waits, so it never counts as demand.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gpupool.core import (
    Bind,
    Decision,
    Evict,
    Framework,
    JobSpec,
    NodeSpec,
    PendingReason,
    Profile,
    QueueTree,
    installed_registry,
    run_cycle,
)
from gpupool.core.decisions import Move
from gpupool.core.diagnostics import PendingKind
from gpupool.core.feasible import never_fits
from gpupool.core.fragmentation import FragModel
from gpupool.core.framework.session import cluster_capacity
from gpupool.core.metrics import cluster_figures, fragmentation_milli
from gpupool.core.predictor import RuntimePredictor, raised_after_overrun
from gpupool.core.queues import GPU_UNITS
from gpupool.sim.cluster import SimCluster
from gpupool.sim.engine import Engine, SimClock
from gpupool.sim.meter import QueueMeter

COMPLETION, ARRIVAL, CYCLE, SAMPLE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class JobArrival:
    time: float
    job: JobSpec
    duration: float


@dataclass(slots=True)
class JobRecord:
    job: JobSpec
    submit: float
    start: float | None = None
    end: float | None = None
    first_start: float | None = None
    preemptions: int = 0
    last_reason: PendingReason | None = None
    attempt: int = 0
    #: refused at submission: the job could not start even on the empty cluster
    rejected: bool = False

    @property
    def gpus_milli(self) -> int:
        return sum(t.shape.total_gpu_milli for t in self.job.tasks)


@dataclass(frozen=True, slots=True)
class Sample:
    time: float
    allocated_milli: int
    capacity_milli: int
    pending: int
    running_tasks: int
    fragmented_nodes: int
    gpu_nodes: int
    #: idle milli-GPU on fragmented nodes (nodes with some but not all of their GPU idle)
    fragmented_free_milli: int = 0
    #: FGD's fragmentation amount F(M) in milli-GPU, against the replay's target workload (0: no model given)
    fgd_frag_milli: float = 0.0


@dataclass
class ReplayRun:
    records: dict[str, JobRecord]
    samples: list[Sample]
    start: float
    end: float
    allocated_area: float
    capacity_milli: int
    cycles: int
    decisions: int
    seconds: float
    cycle_seconds: list[float] = field(default_factory=list)
    moves: int = 0
    #: milli-GPU of jobs started in cycles that moved tasks to make room
    recovered_milli: int = 0
    meter: QueueMeter | None = None
    #: GPU-seconds of work lost by moved jobs that cannot checkpoint (they start over)
    move_lost_gpu_s: float = 0.0
    #: GPU-seconds of work lost by evicted jobs (they go back to the queue and start over)
    evict_lost_gpu_s: float = 0.0
    #: the measurement window [start, end) on the trace clock, and the milli-GPU-seconds allocated inside it
    window: tuple[float, float] | None = None
    window_area: float = 0.0
    #: each job's run time in the trace (seconds)
    durations: dict[str, float] = field(default_factory=dict)


class Replay:
    """One replay of `arrivals` on `nodes` under `profile` (seeded with `seed`)."""

    def __init__(self, nodes: Iterable[NodeSpec], arrivals: Iterable[JobArrival], profile: Profile, seed: int,
                 tick_s: float = 0.0, sample_s: float = 3600.0, queues: QueueTree | None = None,
                 window: tuple[float, float] | None = None, frag: FragModel | None = None) -> None:
        self.engine = Engine()
        self.clock = SimClock(self.engine)
        self.cluster = SimCluster(nodes, queues)
        self.framework = Framework.build(profile, installed_registry())
        self.rng = random.Random(seed)
        self.tick_s, self.sample_s = tick_s, sample_s
        self.arrivals = sorted(arrivals, key=lambda a: (a.time, a.job.id))
        self.durations = {a.job.id: a.duration for a in self.arrivals}
        self.records: dict[str, JobRecord] = {}
        self.pending: dict[str, JobSpec] = {}
        self.samples: list[Sample] = []
        self.predictor = RuntimePredictor()
        self.meter = QueueMeter(queues, self.arrivals[0].time if self.arrivals else 0.0) if queues else None
        self._capacity = cluster_capacity(self.cluster.snapshot((), 0.0))
        self._cycle_at: float | None = None
        self._last_cycle = float("-inf")
        self._area = 0.0
        self._area_t = 0.0
        self.cycles = self.decisions = self.recovered_milli = 0
        self.cycle_seconds: list[float] = []
        self.move_times: list[float] = []
        #: GPU-seconds of work lost by jobs that were moved and cannot checkpoint, or were evicted
        self.move_lost_gpu_s = self.evict_lost_gpu_s = 0.0
        self.window, self.frag = window, frag
        self._window_area = 0.0

    def run(self) -> ReplayRun:
        if not self.arrivals:
            raise ValueError("replay: no jobs to replay")
        start = self.arrivals[0].time
        self._area_t = start
        for arrival in self.arrivals:
            self.engine.schedule(arrival.time, ARRIVAL, self._arrive, arrival)
        self.engine.schedule(start, SAMPLE, self._sample)
        wall = time.perf_counter()
        self.engine.run()
        self._integrate()
        if self.meter:
            self.meter.advance(self.engine.now)
        return ReplayRun(self.records, self.samples, start, self.engine.now, self._area,
                         self.cluster.capacity_gpu_milli, self.cycles, self.decisions, time.perf_counter() - wall,
                         self.cycle_seconds, len(self.move_times), self.recovered_milli, self.meter,
                         self.move_lost_gpu_s, self.evict_lost_gpu_s, self.window, self._window_area, self.durations)

    # 1. events --------------------------------------------------------------------------------

    def _arrive(self, arrival: JobArrival) -> None:
        job = arrival.job
        if job.runtime_estimate_s is None:
            job = replace(job, runtime_estimate_s=self.predictor.predict(job))
        self.records[job.id] = record = JobRecord(job, arrival.time)
        unfit = never_fits(job, self.cluster.table.kinds)
        if unfit:
            record.rejected = True
            record.last_reason = PendingReason(PendingKind.NO_NODE_FITS, f"rejected at submission: {unfit}")
            return
        self.pending[job.id] = job
        self._metered()
        self._want_cycle()

    def _complete(self, payload: tuple[str, int]) -> None:
        job_id, attempt = payload
        record = self.records[job_id]
        if record.attempt != attempt or record.end is not None:
            return  # a stale completion of an attempt that was evicted
        self._integrate()
        for task in record.job.tasks:
            if task.id in self.cluster.running:
                self.cluster.release(task.id)
        record.end = self.engine.now
        self.predictor.observe(record.job, self.durations[job_id])
        self._metered()
        self._want_cycle()

    def _want_cycle(self) -> None:
        at = max(self.engine.now, self._last_cycle + self.tick_s)
        if self.pending and self._cycle_at is None:
            self._cycle_at = at
            self.engine.schedule(at, CYCLE, self._cycle)

    def _sample(self, _: object = None) -> None:
        figures = cluster_figures(self.cluster.table)
        self.samples.append(Sample(self.engine.now, figures.allocated_milli, figures.capacity_milli,
                                   len(self.pending), len(self.cluster.running), figures.fragmented_nodes,
                                   figures.nodes, figures.fragmented_free_milli,
                                   fragmentation_milli(self.cluster.table, self.frag) if self.frag else 0.0))
        if len(self.engine):  # other events remain; pending jobs alone can never start
            self.engine.schedule(self.engine.now + self.sample_s, SAMPLE, self._sample)

    # 2. the scheduling cycle ----------------------------------------------------------------------

    def _cycle(self, _: object = None) -> None:
        self._cycle_at = None
        self._last_cycle = now = self.engine.now
        if not self.pending:
            return
        self._correct_overruns(now)
        recent = tuple(t for t in self.move_times if now - t < 3600)
        history = self.meter.history() if self.meter else None
        snapshot = self.cluster.snapshot(tuple(self.pending.values()), now, recent, history)
        wall = time.perf_counter()
        result = run_cycle(snapshot, self.framework, clock=self.clock, rng=self.rng)
        self.cycle_seconds.append(time.perf_counter() - wall)
        self.cycles += 1
        self.decisions += len(result.decisions)
        self._integrate()
        self.cluster.apply(list(result.decisions), now, {j.id: j for j in snapshot.pending})
        self._apply_effects(result.decisions, now)
        for job_id, reason in result.pending.items():
            self.records[job_id].last_reason = reason
        if self.meter:
            self._metered(result.fair_shares)
            self.meter.check_quotas(self.cluster.usage, self._capacity)

    def _correct_overruns(self, now: float) -> None:
        for task_id, task in list(self.cluster.running.items()):
            if task.expected_end is not None and task.expected_end <= now:
                limit = self.records[task.job_id].job.runtime_limit_s
                limit_end = None if limit is None else task.started_at + limit
                raised = raised_after_overrun(task.started_at, task.expected_end, limit_end)
                self.cluster.running[task_id] = replace(task, expected_end=max(raised, now + 1))

    def _apply_effects(self, decisions: tuple[Decision, ...], now: float) -> None:
        moves = sum(1 for d in decisions if isinstance(d, Move))
        self.move_times.extend([now] * moves)
        if moves:
            started = {d.job_id for d in decisions if isinstance(d, Bind) and d.job_id in self.pending}
            self.recovered_milli += sum(self.records[j].gpus_milli for j in started)
        restarted: set[str] = set()
        for decision in decisions:
            record = self.records[decision.job_id]
            if isinstance(decision, Move):
                if not record.job.checkpointable and decision.job_id not in restarted:
                    restarted.add(decision.job_id)
                    self._restart(record, now)
                continue  # a checkpointable task resumes elsewhere; its completion time stands
            if isinstance(decision, Evict):
                if record.start is not None and record.end is None:
                    self._requeue(record)
            elif decision.job_id in self.pending:
                del self.pending[decision.job_id]
                record.start = now
                record.first_start = record.first_start if record.first_start is not None else now
                self.engine.schedule(now + self.durations[decision.job_id], COMPLETION, self._complete,
                                     (decision.job_id, record.attempt))

    def _restart(self, record: JobRecord, now: float) -> None:
        """A job that cannot checkpoint had a task moved: it starts over, on its tasks' new nodes."""
        assert record.start is not None
        self.move_lost_gpu_s += (now - record.start) * record.gpus_milli / 1000
        record.attempt += 1
        record.start = now
        estimate = record.job.estimate_s
        for task in record.job.tasks:
            if task.id in self.cluster.running:
                self.cluster.running[task.id] = replace(self.cluster.running[task.id], started_at=now,
                                                        expected_end=None if estimate is None else now + estimate)
        self.engine.schedule(now + self.durations[record.job.id], COMPLETION, self._complete,
                             (record.job.id, record.attempt))

    def _requeue(self, record: JobRecord) -> None:
        if record.start is not None:
            self.evict_lost_gpu_s += (self.engine.now - record.start) * record.gpus_milli / 1000
        for task in record.job.tasks:
            if task.id in self.cluster.running:
                self.cluster.release(task.id)
        record.preemptions += 1
        record.attempt += 1
        record.start = None
        self.pending[record.job.id] = record.job
        self._want_cycle()

    def _metered(self, fair_shares: dict[str, int] | None = None) -> None:
        if self.meter is not None:
            waiting = {j.queue for j in self.pending.values()}
            self.meter.update(self.engine.now, self.cluster.usage, fair_shares, waiting, self._capacity[GPU_UNITS])

    def _integrate(self) -> None:
        now = self.engine.now
        self._area += (now - self._area_t) * self.cluster.allocated_gpu_milli
        if self.window is not None:
            inside = min(now, self.window[1]) - max(self._area_t, self.window[0])
            self._window_area += max(0.0, inside) * self.cluster.allocated_gpu_milli
        self._area_t = now
