"""Scheduling-cycle latency with 1,000 pending jobs on the openb cluster (issue 4's budget: < 100 ms).

The cluster is first filled to about 90 % by a fill run (queue guarantees and limits of the example file scaled
by ten, since it is sized for a tenth of openb); then 1,000 pending jobs drawn from
the openb pod shapes (some of them gangs, with runtime estimates) wait in four queues, and each profile
runs `CYCLES` cycles on that snapshot. The baseline is the `fifo` profile measured in the same run.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from fractions import Fraction
from pathlib import Path

from gpupool.core import (
    FixedClock,
    Framework,
    JobSpec,
    QueueTree,
    ResourceVector,
    TaskSpec,
    Workload,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.core.metrics import nearest_rank
from gpupool.sim.cluster import SimCluster
from gpupool.sim.fill import tune
from gpupool.sim.tenants import load_queues
from gpupool.sim.traces.openb import read_nodes, read_pods

CYCLES = 15
PENDING = 1000
#: when the measured cycles run: after every pending job's submission (0..999 s) and before any running task's
#: expected end (each running task's estimate is drawn from 30 min to 4 h), so reservations plan on real ends
NOW = 1000.0
PROFILES = ("fifo", "fair-share", "default")


def _scaled(tree: QueueTree, factor: int) -> QueueTree:
    """`tree` with every guarantee and limit multiplied by `factor` (the example file is sized for a tenth of openb)."""
    def times(vector: ResourceVector | None) -> ResourceVector | None:
        return None if vector is None else ResourceVector({r: factor * v for r, v in vector.items()})

    return QueueTree([dataclasses.replace(s, guaranteed=times(s.guaranteed), limit=times(s.limit),
                                          borrow_limit=times(s.borrow_limit), lend_limit=times(s.lend_limit))
                      for s in tree.specs.values()], tree.gpu_units)


def _filled(openb: Path, queues_file: Path, fill: Fraction = Fraction(9, 10)):
    nodes = read_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = read_pods(openb / "openb_pod_list_default.csv")
    tree = _scaled(load_queues(queues_file), 10)
    cluster = SimCluster(nodes, tree)
    workload = Workload.from_shapes(p.shape for p in pods)
    framework = Framework.build(scheduling_profile("fifo").with_workload(workload), default_registry())
    rng, estimates = random.Random(7), random.Random(11)
    leaves = tree.leaves
    capacity = cluster.capacity_gpu_milli
    order = tune(pods, capacity, fill, rng)
    jobs = {}
    for k, (task_id, pod) in enumerate(order):
        job = JobSpec(task_id, (TaskSpec(task_id, pod.shape),), queue=leaves[k % len(leaves)],
                      runtime_estimate_s=float(estimates.randint(1800, 14_400)))
        jobs[job.id] = job
        result = run_cycle(cluster.snapshot((job,), 0.0), framework, clock=FixedClock(0.0), rng=rng)
        cluster.apply(list(result.decisions), 0.0, jobs)
    pending = []
    for k in range(PENDING):
        pod = pods[rng.randrange(len(pods))]
        tasks = tuple(TaskSpec(f"p{k}/{i}", pod.shape) for i in range(4 if k % 20 == 0 else 1))
        pending.append(JobSpec(f"p{k}", tasks, queue=leaves[k % len(leaves)], submitted_at=float(k),
                               runtime_estimate_s=float(rng.randint(600, 7200))))
    return cluster, tuple(pending), workload


def run(openb: Path, queues_file: Path) -> dict[str, dict[str, float]]:
    """Two situations: a burst (10 % of the GPUs free, about half the pending jobs start in the cycle) and a
    saturated cluster (filled with 1.3x demand, almost nothing starts)."""
    results = {}
    for label, fill in (("burst", Fraction(9, 10)), ("saturated", Fraction(13, 10))):
        results.update({f"{label}/{k}": v for k, v in _measure(openb, queues_file, fill, label).items()})
    print("command: make bench BENCH_ARGS='--suite cycle'")
    return results


def _measure(openb: Path, queues_file: Path, fill: Fraction, label: str) -> dict[str, dict[str, float]]:
    cluster, pending, workload = _filled(openb, queues_file, fill)
    print(f"{label}: cluster {100 * cluster.allocated_gpu_milli / cluster.capacity_gpu_milli:.1f} % allocated, "
          f"{len(pending)} pending jobs in 4 queues")
    results = {}
    for name in PROFILES:
        framework = Framework.build(scheduling_profile(name).with_workload(workload), default_registry())
        times = []
        for c in range(CYCLES):
            snapshot = cluster.snapshot(pending, NOW)
            started = time.perf_counter()
            run_cycle(snapshot, framework, clock=FixedClock(NOW), rng=random.Random(c))
            times.append(1000 * (time.perf_counter() - started))
        warm = times[1:]
        results[name] = {"p50_ms": nearest_rank(warm, 50), "p99_ms": nearest_rank(warm, 99),
                         "mean_ms": statistics.fmean(warm), "cold_ms": times[0]}
        print(f"{name:>10}: cycle p50 {results[name]['p50_ms']:7.1f} ms, p99 {results[name]['p99_ms']:7.1f} ms "
              f"over {len(warm)} cycles; the first, which fills the placement caches, {times[0]:.1f} ms")
    base = results["fifo"]["p50_ms"]
    for name in PROFILES[1:]:
        print(f"{name:>10}: {results[name]['p50_ms'] / base:.2f}x the fifo cycle (baseline measured in this run)")
    return results
