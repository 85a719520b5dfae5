"""Fill sweeps: traces x policies x seeds in parallel, written to an output folder.

Outputs: results.csv (one row per trace, policy, seed and whole arrived percent), summary.json,
PNG plots per trace and report.md that embeds them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from gpupool.core import WORKLOAD_AWARE, NodeSpec, Workload, placement_profile
from gpupool.core.fragmentation import FragModel
from gpupool.sim import fill_report, plots
from gpupool.sim.fill import run_fill, tune
from gpupool.sim.sweep import run_all
from gpupool.sim.traces.openb import Pod, read_nodes, read_pods


def trace_name(pods_path: str | Path) -> str:
    """The pod list's name in results: its file stem without the "openb_pod_list_" prefix."""
    return Path(pods_path).stem.removeprefix("openb_pod_list_")


@lru_cache(maxsize=8)
def load_nodes(path: str) -> tuple[NodeSpec, ...]:
    return tuple(read_nodes(path))


@lru_cache(maxsize=32)
def load_pods(path: str) -> tuple[Pod, ...]:
    return tuple(read_pods(path))


@dataclass(frozen=True, slots=True)
class FillTask:
    nodes: str
    pods: str
    policy: str
    seed: int
    demand: Fraction
    timing: bool


def fill_task(task: FillTask) -> list[dict[str, str]]:
    """One fill run; returns its results.csv rows."""
    nodes = list(load_nodes(task.nodes))
    pods = list(load_pods(task.pods))
    workload = Workload.from_shapes(p.shape for p in pods)
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    order = tune(pods, capacity, task.demand, random.Random(task.seed))
    profile = placement_profile(task.policy)
    if task.policy in WORKLOAD_AWARE:
        profile = profile.with_args(task.policy, workload=workload)
    run = run_fill(nodes, order, profile, task.seed, FragModel(workload))
    target = int(task.demand * 100)
    return fill_report.fill_rows(trace_name(task.pods), task.policy, task.seed, run, target, task.timing)


def summary_table(summary: dict[str, dict[str, dict[str, object]]]) -> str:
    """Markdown: one row per trace and policy with mean +/- sd at 100 % and 130 % arrived."""
    head = "| trace | policy | alloc @100 (%) | alloc @130 (%) | unallocated GPUs @130 | ratio to bound @130 |"
    lines = [head, "|---|---|---:|---:|---:|---:|"]
    for trace, policies in summary.items():
        for policy, levels in policies.items():
            a, b = levels.get("at_100", {}), levels.get("at_130", {})
            ratio = b.get("ratio_to_lp_bound", b.get("ratio_to_capacity_bound", ""))
            lines.append(f"| {trace} | {policy} | {a.get('mean', '')} ± {a.get('sd', '')} | "
                         f"{b.get('mean', '')} ± {b.get('sd', '')} | {b.get('unallocated_gpus', '')} | {ratio} |")
    return "\n".join(lines)


def run_fill_sweep(nodes: Path, pods: list[Path], policies: list[str], seeds: list[int], demand: Fraction,
                   out: Path, jobs: int, timing: bool, command: str, quiet: bool = False) -> dict[str, object]:
    for policy in policies:
        placement_profile(policy)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [FillTask(str(nodes), str(p), policy, seed, demand, timing)
             for p in pods for policy in policies for seed in seeds]
    rows = [row for rows in run_all(fill_task, tasks, jobs, "fill runs", quiet) for row in rows]
    fill_report.write_results(out, rows)
    total_gpus = sum(len(n.gpus) for n in load_nodes(str(nodes)))
    summary = fill_report.summarise(rows, {trace_name(p): total_gpus for p in pods})
    document = {"protocol": "fill", "demand": str(demand), "seeds": seeds, "command": command,
                "nodes": str(nodes), "total_gpus": total_gpus, "traces": summary}
    fill_report.write_summary(out, document)
    images = plots.fill_plots(out, rows)
    plots.write_report(out, "gpupool fill simulation", command, summary_table(summary), images)
    return document
