"""The FGD paper's "fill" protocol (BENCHMARKS.md §2.2): tune the pod list to a target GPU demand,
submit pods one at a time in a seeded order, never release them, and record allocation after each.

Every pod goes through `core.run_cycle` as a one-job snapshot, exactly as the control plane would
schedule it. A pod that fits nowhere is recorded as failed and the run goes on.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

from gpupool.core import (
    Bind,
    FixedClock,
    Framework,
    JobSpec,
    NodeSpec,
    Profile,
    TaskSpec,
    installed_registry,
    run_cycle,
)
from gpupool.core.fragmentation import FragModel
from gpupool.sim.cluster import SimCluster
from gpupool.sim.traces.openb import Pod

#: how ties between equal nodes fall: "shuffled" (the paper's protocol: a seeded random node order per run) or
#: "name" (the trace's node names, as the live scheduler breaks ties)
NodeOrder = Literal["shuffled", "name"]
NODE_ORDERS: tuple[NodeOrder, ...] = ("shuffled", "name")


@dataclass(frozen=True, slots=True)
class Record:
    """After one pod: cumulative arrived GPU request, allocated milli-GPU, fragmentation (milli) and
    the number of pods that found no node so far."""

    arrived_milli: int
    allocated_milli: int
    frag_milli: float
    failed_so_far: int


@dataclass(frozen=True, slots=True)
class FillRun:
    records: list[Record]
    capacity_milli: int
    decisions: int
    seconds: float


def tune(pods: list[Pod], capacity_milli: int, demand: Fraction, rng: random.Random) -> list[tuple[str, Pod]]:
    """The submission order: (task id, pod) pairs whose GPU request totals at most demand x capacity.

    Sort by name and shuffle with `rng`; above the target, drop uniformly drawn pods until at or
    below it; below it, append uniform draws (with replacement) until the next draw would exceed it.
    """
    if not pods:
        raise ValueError("pods: the pod list is empty")
    original = sorted(pods, key=lambda p: p.name)
    order = [(p.name, p) for p in original]
    rng.shuffle(order)
    target = demand * capacity_milli
    total = sum(p.shape.total_gpu_milli for _, p in order)
    while total > target:
        _, dropped = order.pop(rng.randrange(len(order)))
        total -= dropped.shape.total_gpu_milli
    copies = 0
    while True:
        pod = original[rng.randrange(len(original))]
        if total + pod.shape.total_gpu_milli > target:
            return order
        copies += 1
        order.append((f"{pod.name}~{copies}", pod))
        total += pod.shape.total_gpu_milli


def shuffled_names(nodes: list[NodeSpec], rng: random.Random) -> list[NodeSpec]:
    """The nodes, sorted by name, each renamed `<rank>-<name>` with its rank in a uniform permutation drawn from `rng`
    (zero-padded, at least 4 digits, so that name order is rank order).

    Ties between equal scores go to the lowest node name, and a trace's names group nodes of one kind (openb's first
    22 are 2-GPU P100 nodes), so name order decides where the nodes that every policy scores alike fill up first:
    CPU-only pods under GpuPacking, GpuClustering and FGD above all. The FGD artifact renames its nodes this way on
    every run, so its "lowest name" is a per-seed random order, and the published results average over it.
    """
    ordered = sorted(nodes, key=lambda n: n.name)
    ranks = list(range(len(ordered)))
    rng.shuffle(ranks)
    width = max(4, len(str(len(ordered) - 1)))
    return [replace(n, name=f"{rank:0{width}d}-{n.name}") for n, rank in zip(ordered, ranks, strict=True)]


def run_fill(nodes: list[NodeSpec], order: list[tuple[str, Pod]], profile: Profile, seed: int,
             frag: FragModel) -> FillRun:
    """Submit `order` one pod per cycle; the cycle RNG is seeded with `seed`."""
    cluster = SimCluster(nodes)
    framework = Framework.build(profile, installed_registry())
    rng = random.Random(seed)
    clock = FixedClock()
    table = cluster.table
    node_frag = [frag.frag(k.model, s.cpu_free, s.gpu_free) for k, s in zip(table.kinds, table.states, strict=True)]
    frag_total = sum(node_frag)
    records: list[Record] = []
    arrived = failed = 0
    started = time.perf_counter()
    for task_id, pod in order:
        job = JobSpec(task_id, (TaskSpec(task_id, pod.shape),))
        result = run_cycle(cluster.snapshot((job,), clock.now()), framework, clock=clock, rng=rng)
        cluster.apply(list(result.decisions))
        for decision in result.decisions:
            if isinstance(decision, Bind):
                i = cluster.table.index[decision.node]
                kind, state = cluster.table.kinds[i], cluster.table.states[i]
                new = frag.frag(kind.model, state.cpu_free, state.gpu_free)
                frag_total += new - node_frag[i]
                node_frag[i] = new
        failed += not result.decisions
        arrived += pod.shape.total_gpu_milli
        records.append(Record(arrived, cluster.allocated_gpu_milli, frag_total, failed))
    seconds = time.perf_counter() - started
    return FillRun(records, cluster.capacity_gpu_milli, len(order), seconds)
