"""Prometheus metrics: cluster figures read from the scheduler's cache at scrape time, and cycle counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpupool.core.metrics import cluster_figures
from gpupool.server.scheduler.cache import ClusterCache


class Metrics:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.registry = CollectorRegistry()
        self.gar = Gauge("gpupool_gpu_allocation_ratio", "allocated / schedulable GPUs (GAR)", registry=self.registry)
        self.gfr = Gauge("gpupool_gpu_fragmentation_ratio", "share of GPU nodes partly allocated (GFR)",
                         registry=self.registry)
        self.allocated = Gauge("gpupool_queue_allocated_gpus", "GPUs allocated per queue", ["queue"],
                               registry=self.registry)
        self.fair = Gauge("gpupool_queue_fair_share_gpus", "GPU-unit fair share per queue", ["queue"],
                          registry=self.registry)
        self.pending = Gauge("gpupool_queue_pending_jobs", "pending jobs per queue", ["queue"], registry=self.registry)
        self.used = Gauge("gpupool_queue_used_gpus", "GPUs in use (utilisation-weighted) per queue", ["queue"],
                          registry=self.registry)
        self.cycle = Histogram("gpupool_scheduler_cycle_seconds", "scheduling cycle latency", registry=self.registry,
                               buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.decisions = Counter("gpupool_scheduler_decisions_total", "decisions made", registry=self.registry)
        self.decision_rate = Gauge("gpupool_scheduler_decisions_per_second", "decisions per second of cycle time",
                                   registry=self.registry)
        self.impaired = Gauge("gpupool_cp_impaired", "1 while the liveness guard holds LOST transitions "
                              "(start or takeover, database unreachable, mass silence)", registry=self.registry)
        self.leader = Gauge("gpupool_scheduler_leader", "1 while this process holds the scheduler lease",
                            registry=self.registry)
        self.epoch = Gauge("gpupool_scheduler_epoch", "fencing epoch of this process's latest lease",
                           registry=self.registry)
        self.fenced_refused = Counter("gpupool_fenced_writes_refused", "scheduler writes refused by the fencing "
                                      "check (this process wrote with a deposed epoch)", registry=self.registry)
        self.nodes_lost = Counter("gpupool_nodes_lost", "nodes declared lost", registry=self.registry)
        self.lost_requeues = Counter("gpupool_lost_requeues", "jobs requeued because their node was declared lost",
                                     registry=self.registry)

    def observe_cycle(self, seconds: float, decisions: int, fair_shares: dict[str, int]) -> None:
        self.cycle.observe(seconds)
        self.decisions.inc(decisions)
        if seconds > 0 and decisions:
            self.decision_rate.set(decisions / seconds)
        for queue, share in fair_shares.items():
            self.fair.labels(queue).set(share / 1000)

    def node_lost(self, requeued: int) -> None:
        """One node declared lost, with the jobs it requeued."""
        self.nodes_lost.inc()
        self.lost_requeues.inc(requeued)

    def observe_control_plane(self, impaired: bool, leader: bool, epoch: int) -> None:
        """The control plane's own state, read at scrape time (RELIABILITY.md T5, T8)."""
        self.impaired.set(int(impaired))
        self.leader.set(int(leader))
        self.epoch.set(epoch)

    def refresh(self, pending: dict[str, int], allocated: dict[str, float], used: dict[str, float]) -> None:
        with self.cache.lock:
            figures = cluster_figures(self.cache.table)
        self.gar.set(float(figures.gar))
        self.gfr.set(float(figures.gfr))
        for queue, count in pending.items():
            self.pending.labels(queue).set(count)
        for queue, gpus in allocated.items():
            self.allocated.labels(queue).set(gpus)
        for queue, gpus in used.items():
            self.used.labels(queue).set(gpus)
