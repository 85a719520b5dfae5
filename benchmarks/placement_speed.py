"""Placement decisions per second of `fgd` and `best` at about 1k, 5k and 10k nodes, cached engine vs an
uncached evaluation of every node per decision, measured in the same run."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from gpupool.core import Framework, Workload, default_registry, placement_profile
from gpupool.core.fragmentation import FragModel
from gpupool.core.framework.placement import FEASIBLE_MIN
from gpupool.sim.cluster import SimCluster
from gpupool.sim.fill import run_fill, tune
from gpupool.sim.traces.openb import read_nodes, read_pods

SCALES = (1, 4, 8)
POLICIES = ("fgd", "best")
BASELINE_DECISIONS = 300


def scaled(nodes, copies):
    return [replace(n, name=f"{n.name}-{c}") for c in range(copies) for n in nodes]


def uncached_rate(nodes, order, profile) -> float:
    """Decisions/s when every decision evaluates every node afresh (no memo, no score arrays)."""
    cluster = SimCluster(nodes)
    placer = Framework.build(profile, default_registry()).plugins.placer
    table, rng = cluster.table, random.Random(0)
    started = time.perf_counter()
    for _, pod in order[:BASELINE_DECISIONS]:
        best, best_i = FEASIBLE_MIN - 1, None
        for i, (kind, state) in enumerate(zip(table.kinds, table.states, strict=True)):
            score = placer._evaluate(kind, state, pod.shape)
            if score > best:
                best, best_i = score, i
        if best_i is not None and best >= FEASIBLE_MIN:
            shares = placer.pick(table, best_i, pod.shape, rng)
            table.set_state(best_i, table.states[best_i].take(pod.shape, shares))
    return BASELINE_DECISIONS / (time.perf_counter() - started)


def run(openb: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    base_nodes = read_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = read_pods(openb / "openb_pod_list_default.csv")
    workload = Workload.from_shapes(p.shape for p in pods)
    results = []
    for policy, copies in [(p, c) for p in POLICIES for c in SCALES]:
        profile = placement_profile(policy).with_workload(workload)
        nodes = scaled(base_nodes, copies)
        capacity = sum(len(n.gpus) for n in nodes) * 1000
        order = tune(pods, capacity, Fraction(13, 10), random.Random(42))
        run_ = run_fill(nodes, order, profile, 42, FragModel(workload))
        rate = run_.decisions / run_.seconds
        baseline = uncached_rate(nodes, order, profile)
        results.append({"policy": policy, "nodes": len(nodes), "decisions": run_.decisions,
                        "seconds": round(run_.seconds, 2),
                        "decisions_per_s": round(rate), "uncached_decisions_per_s": round(baseline, 1),
                        "speedup": round(rate / baseline, 1)})
        print(f"{policy:>5} on {len(nodes):>6} nodes: {rate:8.0f} decisions/s over {run_.decisions} pods "
              f"({run_.seconds:.1f} s); uncached baseline {baseline:7.1f}/s; ratio {rate / baseline:.0f}x")
    (out / "speed.json").write_text(json.dumps(results, indent=2) + "\n")
    print("command: make bench BENCH_ARGS='--suite speed'   (benchmarks/placement_speed.py, one core)")
