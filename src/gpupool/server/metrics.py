"""Prometheus metrics: cluster figures read from the scheduler's cache at scrape time, per-queue figures the
scheduler leaves after each cycle, and counters.

/metrics is for operators (bearer token, as Prometheus sends it): the per-queue series name every organisation's
queues. With `metrics_public` a scrape without a token gets `public_registry()`: only cluster-wide series, which name
nothing of a tenant.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from gpupool.core.metrics import cluster_figures
from gpupool.protocol.devices import GpuTelemetry
from gpupool.server.scheduler.cache import ClusterCache

#: a queue's series are labelled with its organisation ("" for a shared queue) and its own name
QUEUE_LABELS = ("org", "queue")


def queue_labels(key: str) -> tuple[str, str]:
    """(organisation, queue name) of a scheduler queue key ("org:name", or "name" for a shared queue)."""
    org, _, name = key.rpartition(":")
    return org, name


#: the series that name a queue (or a route): left out of the public view
NAMED = frozenset({"gpupool_queue_allocated_gpus", "gpupool_queue_fair_share_gpus", "gpupool_queue_pending_jobs",
                   "gpupool_queue_used_gpus", "gpupool_api_unauthenticated_requests"})
Telemetry = Callable[[], Mapping[str, Iterable[GpuTelemetry]]]


class PublicView:
    """What `generate_latest` reads of a registry, less the series in NAMED."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.registry.collect() if family.name not in NAMED)


class Metrics:
    """`telemetry()` gives each node id's latest GPU samples (the agent hub's), for the utilisation-weighted gauge."""

    def __init__(self, cache: ClusterCache, telemetry: Telemetry = dict) -> None:
        self.cache, self.telemetry = cache, telemetry
        self._queues: set[str] = set()
        self.registry = CollectorRegistry()
        self.gar = Gauge("gpupool_gpu_allocation_ratio", "allocated / schedulable GPUs (GAR)", registry=self.registry)
        self.gfr = Gauge("gpupool_gpu_fragmentation_ratio", "share of GPU nodes partly allocated (GFR)",
                         registry=self.registry)
        self.allocated = Gauge("gpupool_queue_allocated_gpus", "GPUs allocated per queue", QUEUE_LABELS,
                               registry=self.registry)
        self.fair = Gauge("gpupool_queue_fair_share_gpus", "GPU-unit fair share per queue", QUEUE_LABELS,
                          registry=self.registry)
        self.pending = Gauge("gpupool_queue_pending_jobs", "pending jobs per queue", QUEUE_LABELS,
                             registry=self.registry)
        self.used = Gauge("gpupool_queue_used_gpus", "GPUs in use (utilisation-weighted) per queue", QUEUE_LABELS,
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
        self.unauthenticated = Counter(
            "gpupool_api_unauthenticated_requests", "mutating API requests answered without a verified identity, by "
            "route template and status (a bounded sample of them is in the audit log)", ["route", "status"],
            registry=self.registry)

    def public_registry(self) -> PublicView:
        """The cluster-wide series only (see the module docstring)."""
        return PublicView(self.registry)

    def count_unauthenticated(self, route: str, status: int) -> None:
        self.unauthenticated.labels(route, str(status)).inc()

    def observe_cycle(self, seconds: float, decisions: int, fair_shares: Mapping[str, int],
                      pending: Iterable[str] = ()) -> None:
        """One scheduling cycle: its time and decisions, and the queues' figures after it (`pending`: the queue of
        each job still pending)."""
        self.cycle.observe(seconds)
        self.decisions.inc(decisions)
        if seconds > 0 and decisions:
            self.decision_rate.set(decisions / seconds)
        self.observe_queues(Tally(pending), fair_shares)

    def node_lost(self, requeued: int) -> None:
        """One node declared lost, with the jobs it requeued."""
        self.nodes_lost.inc()
        self.lost_requeues.inc(requeued)

    def observe_control_plane(self, impaired: bool, leader: bool, epoch: int) -> None:
        """The control plane's own state, read at scrape time (RELIABILITY.md T5, T8)."""
        self.impaired.set(int(impaired))
        self.leader.set(int(leader))
        self.epoch.set(epoch)

    def refresh(self) -> None:
        """The cluster-wide figures, read from the cache at scrape time."""
        with self.cache.lock:
            figures = cluster_figures(self.cache.table)
        self.gar.set(float(figures.gar))
        self.gfr.set(float(figures.gfr))

    def observe_queues(self, pending: Mapping[str, int], fair_shares: Mapping[str, int]) -> None:
        """Per queue, after a cycle: pending jobs, fair share, and the GPUs its running tasks hold (allocated) and
        use (each share weighted by its GPU's latest utilisation). A queue with none of these any more (deleted, or
        idle with no share) leaves the series."""
        allocated, used = self._holdings()
        queues = set(pending) | set(fair_shares) | set(allocated)
        for queue in queues:
            labels = queue_labels(queue)
            self.pending.labels(*labels).set(pending.get(queue, 0))
            self.fair.labels(*labels).set(fair_shares.get(queue, 0) / 1000)
            self.allocated.labels(*labels).set(allocated.get(queue, 0.0))
            self.used.labels(*labels).set(used.get(queue, 0.0))
        for gone in self._queues - queues:
            for gauge in (self.pending, self.fair, self.allocated, self.used):
                gauge.remove(*queue_labels(gone))
        self._queues = queues

    def _holdings(self) -> tuple[dict[str, float], dict[str, float]]:
        samples = list(self.telemetry().values())  # a copy: the hub's event loop adds nodes meanwhile
        utilisation = {t.uuid: t.utilization_pct / 100 for node in samples for t in node}
        allocated: dict[str, float] = defaultdict(float)
        used: dict[str, float] = defaultdict(float)
        with self.cache.lock:
            for held in self.cache.held.values():
                task, node = held.task, self.cache.nodes.get(held.task.node)
                for share in task.shares:
                    gpus = share.milli / 1000
                    allocated[task.queue] += gpus
                    if node is not None and share.index < len(node.spec.gpus):
                        used[task.queue] += gpus * utilisation.get(node.spec.gpus[share.index].uuid, 0.0)
        return allocated, used
