"""Sweeps: traces x policies x seeds in parallel processes, written to an output folder.

Fill: results.csv (one row per trace, policy, seed and whole arrived percent), summary.json, PNG plots
per trace and report.md. Replay: results.csv (cluster samples over time), jobs.csv (one row per job),
summary.json, plots and report.md.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from gpupool.core import (
    JobSpec,
    NodeSpec,
    Profile,
    QueueTree,
    TaskSpec,
    Workload,
    installed_registry,
    placement_profile,
    scheduling_profile,
)
from gpupool.core.fragmentation import FragModel
from gpupool.sim import fill_report, plots, replay_report
from gpupool.sim.bound import lp_bound
from gpupool.sim.fill import NodeOrder, run_fill, shuffled_names, tune
from gpupool.sim.provenance import profile_config, provenance
from gpupool.sim.replay import JobArrival, Replay
from gpupool.sim.sweep import run_all
from gpupool.sim.tenants import NO_TENANT, TENANTS, assign_by_hash, fit_guarantees, load_queues, tenant_tree
from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.jobtable import read_workload
from gpupool.sim.traces.openb import Pod, pod_duration, read_nodes, require_times


def trace_name(pods_path: str | Path) -> str:
    """The pod list's name in results: its file stem without the "openb_pod_list_" prefix."""
    return Path(pods_path).stem.removeprefix("openb_pod_list_")


@lru_cache(maxsize=8)
def load_nodes(path: str) -> tuple[NodeSpec, ...]:
    return tuple(read_nodes(path))


@lru_cache(maxsize=32)
def load_pods(path: str) -> tuple[Pod, ...]:
    return tuple(read_workload(path))


def target_workload(pods: list[Pod], nodes: list[NodeSpec]) -> Workload:
    """The workload-aware policies' M: the pods' task classes, meeting the nodes' GPUs per model."""
    return Workload.from_shapes(p.shape for p in pods).with_supply(Counter(g.model for n in nodes for g in n.gpus))


@dataclass(frozen=True, slots=True)
class FillTask:
    nodes: str
    pods: str
    policy: str
    seed: int
    demand: Fraction
    timing: bool
    node_order: NodeOrder = "shuffled"


def fill_task(task: FillTask) -> list[dict[str, str]]:
    """One fill run; returns its results.csv rows."""
    nodes = list(load_nodes(task.nodes))
    pods = list(load_pods(task.pods))
    workload = target_workload(pods, nodes)
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    rng = random.Random(task.seed)
    order = tune(pods, capacity, task.demand, rng)
    if task.node_order == "shuffled":  # drawn after the pods, as the FGD artifact draws its node names
        nodes = shuffled_names(nodes, rng)
    profile = placement_profile(task.policy, installed_registry()).with_workload(workload)
    run = run_fill(nodes, order, profile, task.seed, FragModel(workload))
    target = int(task.demand * 100)
    return fill_report.fill_rows(trace_name(task.pods), task.policy, task.seed, run, target, task.timing)


def summary_table(summary: dict[str, dict[str, dict[str, object]]]) -> str:
    """Markdown: one row per trace and policy with mean +/- sd at 100 % and 130 % arrived."""
    head = ("| trace | policy | alloc @100 (%) | alloc @130 (%) | unallocated GPUs @130 | LP bound @130 (%) "
            "| ratio to bound @130 | gap to bound @130 (GPUs) |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for trace, policies in summary.items():
        for policy, levels in policies.items():
            a, b = levels.get("at_100", {}), levels.get("at_130", {})
            lines.append(f"| {trace} | {policy} | {a.get('mean', '')} ± {a.get('sd', '')} | "
                         f"{b.get('mean', '')} ± {b.get('sd', '')} | {b.get('unallocated_gpus', '')} | "
                         f"{b.get('lp_bound', '')} | {b.get('ratio_to_lp_bound', '')} | "
                         f"{b.get('gap_gpus_to_lp_bound', '')} |")
    lines += ["", "Allocation: allocated GPUs / cluster GPUs, mean ± sd over seeds. LP bound: the most GPU "
              "allocation any placement could reach with the pods arrived by 130 % (the LP relaxation of packing "
              "them, `gpupool sim bound`); at 100 the cluster's capacity is what binds, not the packing."]
    return "\n".join(lines)


#: pods one fill run may submit (openb's fill at 1.3 x capacity submits about 16,000)
MAX_FILL_PODS = 1_000_000


def _fill_inputs(nodes: Path, pods: list[Path], demand: Fraction) -> None:
    """Read and check every input before any worker starts (a bad file ends the run at once): the fill protocol
    needs GPUs, and pods that ask for them, few enough to reach `demand` x capacity in MAX_FILL_PODS pods."""
    capacity = sum(len(n.gpus) for n in load_nodes(str(nodes))) * 1000
    if not capacity:
        raise TraceError(str(nodes), 1, "gpu", "no node has a GPU: the fill protocol measures GPU allocation")
    for path in pods:
        listed = load_pods(str(path))
        asked = sum(p.shape.total_gpu_milli for p in listed)
        if not asked or demand * capacity * len(listed) / asked > MAX_FILL_PODS:
            raise TraceError(str(path), 1, "num_gpu", f"the pods ask for {asked / 1000:g} GPUs in all: reaching "
                             f"{float(demand):g} x the {capacity // 1000} GPUs of {nodes} would take more than "
                             f"{MAX_FILL_PODS} pods")


def _replay_inputs(nodes: Path, pods: list[Path]) -> None:
    """Read and check every input before any worker starts: a bad file ends the run at once."""
    load_nodes(str(nodes))
    for path in pods:
        require_times(path, list(load_pods(str(path))))


def run_fill_sweep(nodes: Path, pods: list[Path], policies: list[str], seeds: list[int], demand: Fraction,
                   out: Path, jobs: int, timing: bool, command: str, quiet: bool = False,
                   node_order: NodeOrder = "shuffled") -> dict[str, object]:
    for policy in policies:
        placement_profile(policy, installed_registry())
    _fill_inputs(nodes, pods, demand)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [FillTask(str(nodes), str(p), policy, seed, demand, timing, node_order)
             for p in pods for policy in policies for seed in seeds]
    rows = [row for rows in run_all(fill_task, tasks, jobs, "fill runs", quiet) for row in rows]
    fill_report.write_results(out, rows)
    node_list = load_nodes(str(nodes))
    total_gpus = sum(len(n.gpus) for n in node_list)
    bounds = {(trace_name(p), level): lp_bound(node_list, [q.shape for q in load_pods(str(p))],
                                                Fraction(level, 100)).pct
              for p in pods for level in fill_report.SUMMARY_LEVELS}
    summary = fill_report.summarise(rows, {trace_name(p): total_gpus for p in pods}, bounds)
    document = {"protocol": "fill", "demand": str(demand), "seeds": seeds, "node_order": node_order,
                "command": command, "nodes": str(nodes), "total_gpus": total_gpus, "traces": summary,
                "provenance": provenance([nodes, *pods], {
                    "protocol": "fill", "nodes": str(nodes), "pods": [str(p) for p in pods], "demand": str(demand),
                    "node_order": node_order, "timing": timing,
                    "profiles": {p: profile_config(placement_profile(p, installed_registry())) for p in policies}},
                    seeds)}
    fill_report.write_summary(out, document)
    images = plots.fill_plots(out, rows)
    plots.write_report(out, "gpupool fill simulation", command, summary_table(summary), images)
    return document


QOS_PRIORITY = {"LS": 10, "Guaranteed": 10, "Burstable": 5, "BE": 0}


@dataclass(frozen=True, slots=True)
class ReplayTask:
    nodes: str
    pods: str
    policy: str
    seed: int
    tick_s: float
    sample_s: float
    timing: bool
    consolidate: tuple[int, int] | None = None
    profile: str | None = None
    queues: str | None = None
    assign: str = "hash"
    time_scale: float = 1.0
    node_stride: int = 1
    #: a job of the trace to leave out (a perturbed run), or None
    leave_out: str | None = None
    #: every job's runtime estimate is its true duration (an oracle), instead of the predictor's
    exact_estimates: bool = False
    #: replay only the jobs submitted in [from, until) on the trace clock (None: open)
    submitted: tuple[int | None, int | None] = (None, None)
    #: the measurement window: from the first submission + warmup_s to the last submission - cooldown_s
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    #: scale a queue file's guarantees down to the simulated cluster instead of refusing it
    scale_guarantees: bool = False
    #: delay each job's submission by a seeded uniform draw in [0, jitter_s) seconds (0: the trace's times)
    jitter_s: float = 0.0
    #: the sweep runs several placement policies under each profile: labels name both (`fifo@fgd`)
    with_policy: bool = False

    @property
    def label(self) -> str:
        name = (f"{self.profile}@{self.policy}" if self.with_policy else self.profile) if self.profile else self.policy
        return name if self.leave_out is None else f"{name}{replay_report.WITHOUT}{self.leave_out}"


def openb_arrivals(pods: list[Pod], tree: QueueTree | None = None, assign: str = "hash",
                   time_scale: float = 1.0, exact_estimates: bool = False) -> list[JobArrival]:
    """One job per pod, arriving at its creation time (divided by `time_scale`) and running for its trace
    duration. With a queue tree, `assign` picks the leaf: "hash" (stable hash of the pod name) or "column"
    (the pod list's `queue` column). Priority comes from the QoS class (LS/Guaranteed 10, Burstable 5, BE 0).
    With `exact_estimates` each job's runtime estimate is its duration; otherwise the replay's predictor gives it."""
    arrivals = []
    leaves = tree.leaves if tree else []
    for pod in pods:
        assert pod.creation_time is not None
        queue = "default"
        if tree is not None:
            queue = pod.queue if assign == "column" else assign_by_hash(pod.name, leaves)
        tasks = tuple(TaskSpec(f"{pod.name}/{k}", pod.shape) for k in range(pod.gang))
        at = pod.creation_time / time_scale
        duration = float(pod_duration(pod))
        priority = QOS_PRIORITY.get(pod.qos, 0) if pod.priority is None else pod.priority
        job = JobSpec(pod.name, tasks, queue=queue, priority=priority, submitted_at=at,
                      runtime_limit_s=pod.runtime_limit_s, user=pod.user,
                      runtime_estimate_s=duration if exact_estimates else None)
        arrivals.append(JobArrival(at, job, duration))
    return arrivals


def _replay_profile(task: ReplayTask, pods: list[Pod], nodes: list[NodeSpec]) -> Profile:
    profile = resolved_profile(task)
    return profile.with_workload(target_workload(pods, nodes)) if profile.workload_plugins else profile


def resolved_profile(task: ReplayTask) -> Profile:
    """The profile a replay task runs, before its workload-aware plugins get the trace's target workload."""
    registry = installed_registry()
    profile = (scheduling_profile(task.profile, task.policy, registry) if task.profile
               else placement_profile(task.policy, registry))
    if task.consolidate is not None:
        per_cycle, per_hour = task.consolidate
        actions = [a for a in profile.actions if a != "consolidate"]  # moving goes before any eviction
        actions.insert(actions.index("allocate") + 1 if "allocate" in actions else 0, "consolidate")
        # the ordinary consolidation replaces a profile's own (fair-share's moves for starving jobs only)
        args = {**profile.args, "consolidate": {"max_moves_per_cycle": per_cycle, "max_moves_per_hour": per_hour}}
        profile = replace(profile.with_actions(*actions), args=args)
    return profile


def replay_task(task: ReplayTask) -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]],
                                           dict[str, object]]:
    """One replay; returns its sample rows, job rows, queue rows and summary."""
    nodes = list(load_nodes(task.nodes))[:: task.node_stride]
    pods = list(load_pods(task.pods))
    require_times(task.pods, pods)
    pods = submitted_between(pods, *task.submitted)
    if task.leave_out is not None:
        pods = [p for p in pods if p.name != task.leave_out]
    tree, pods, assign = replay_queues(task.queues, task.assign, pods, nodes, task.scale_guarantees)
    arrivals = jittered(openb_arrivals(pods, tree, assign, task.time_scale, task.exact_estimates), task.seed,
                        task.jitter_s)
    window = measurement_window(arrivals, task.warmup_s, task.cooldown_s)
    frag = FragModel(target_workload(pods, nodes))
    run = Replay(nodes, arrivals, _replay_profile(task, pods, nodes), task.seed, task.tick_s, task.sample_s, tree,
                 window, frag).run()
    trace, label = trace_name(task.pods), task.label
    return (replay_report.sample_rows(trace, label, task.seed, run),
            replay_report.job_rows(trace, label, task.seed, run),
            replay_report.queue_rows(trace, label, task.seed, run),
            {"trace": trace, "policy": label, "seed": task.seed, **replay_report.run_summary(run, task.timing)})


def jittered(arrivals: list[JobArrival], seed: int, jitter_s: float) -> list[JobArrival]:
    """Each arrival delayed by a uniform draw in [0, jitter_s) from a generator seeded by (seed, job id): a trace
    replayed under several seeds then gives several samples of nearby workloads, and the intervals over seeds say
    how much the figures move with them (without it, a replay of a trace is deterministic)."""
    if not jitter_s:
        return arrivals
    out = []
    for a in arrivals:
        at = a.time + random.Random(f"{seed}/{a.job.id}").uniform(0, jitter_s)
        out.append(JobArrival(at, replace(a.job, submitted_at=at), a.duration))
    return out


def measurement_window(arrivals: list[JobArrival], warmup_s: float, cooldown_s: float) -> tuple[float, float]:
    """[first submission + warmup_s, last submission - cooldown_s) on the replay's clock; ValueError if empty."""
    first, last = min(a.time for a in arrivals), max(a.time for a in arrivals)
    begin, end = first + warmup_s, last - cooldown_s
    if end <= begin and (warmup_s or cooldown_s):
        raise ValueError(f"--warmup-s {warmup_s:g} and --cooldown-s {cooldown_s:g} leave no measurement window: "
                         f"the jobs are submitted over {last - first:g} s")
    return begin, max(end, begin + 1.0)


def submitted_between(pods: list[Pod], begin: int | None, end: int | None) -> list[Pod]:
    """The pods submitted in [begin, end) (None: unbounded on that side); ValueError if none is."""
    if begin is None and end is None:
        return pods
    kept = [p for p in pods if (begin is None or (p.creation_time or 0) >= begin)
            and (end is None or (p.creation_time or 0) < end)]
    if not kept:
        raise ValueError(f"--submitted: no job of the trace was submitted in [{begin}, {end})")
    return kept


def replay_queues(queues: str | None, assign: str, pods: list[Pod], nodes: list[NodeSpec],
                  scale: bool = False) -> tuple[QueueTree | None, list[Pod], str]:
    """(queue tree, pods, how jobs map to leaves): a queue file's, or with TENANTS the trace's tenants as queues
    (each pod's queue column set to its tenant's leaf)."""
    if queues is None:
        return None, pods, assign
    if queues != TENANTS:
        return fit_guarantees(load_queues(queues), nodes, scale, queues), pods, assign
    demand: dict[str, int] = {}
    for p in pods:
        tenant = p.queue or NO_TENANT
        demand[tenant] = demand.get(tenant, 0) + p.shape.total_gpu_milli * p.gang * pod_duration(p)
    tree, leaf_of = tenant_tree(demand, sum(len(n.gpus) for n in nodes) * 1000)
    return tree, [replace(p, queue=leaf_of[p.queue or NO_TENANT]) for p in pods], "column"


def _mean_summaries(runs: list[dict[str, object]]) -> dict[str, dict[str, dict[str, object]]]:
    grouped: dict[tuple[str, str], list[dict[str, object]]] = {}
    for run in runs:
        grouped.setdefault((str(run["trace"]), str(run["policy"])), []).append(run)
    out: dict[str, dict[str, dict[str, object]]] = {}
    for (trace, policy), items in sorted(grouped.items()):
        entry: dict[str, object] = {"seeds": len(items)}
        for key in ("mean_wait_s", "p50_wait_s", "p99_wait_s", "max_wait_s", "gar_window", "gar_run", "started",
                    "never_started", "preemptions", "useful_gpu_hours", "redone_gpu_hours", "makespan_s",
                    "gfr_nodes_pct", "gfr_gpu_pct", "fgd_frag_rate_pct",
                    "cycle_p50_ms", "cycle_p99_ms", "decisions_per_s", "migrations", "migrations_per_hour",
                    "gpus_recovered_per_migration", "quota_violations", "fair_share_max_deviation_pct",
                    "jtted_median", "jtted_under_pct"):
            values = [float(i[key]) for i in items if i.get(key) is not None]  # type: ignore[arg-type]
            if values:
                entry[key] = round(sum(values) / len(values), 4)
        out.setdefault(trace, {})[policy] = entry
    return out


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    tick_s: float = 0.0
    sample_s: float = 3600.0
    timing: bool = True
    consolidate: tuple[int, int] | None = None
    profiles: tuple[str | None, ...] = (None,)
    queues: str | None = None
    assign: str = "hash"
    time_scale: float = 1.0
    node_stride: int = 1
    #: perturbed runs per trace, profile and seed, each with one job left out
    leave_one_out: int = 0
    exact_estimates: bool = False
    submitted: tuple[int | None, int | None] = (None, None)
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    scale_guarantees: bool = False
    jitter_s: float = 0.0


def left_out_jobs(pods: Path, seed: int, count: int) -> list[str]:
    """`count` distinct job names of the pod list, drawn with `seed` (the same for every profile)."""
    names = sorted(p.name for p in load_pods(str(pods)))
    if count > len(names):
        raise ValueError(f"--leave-one-out: {count} is more than the {len(names)} jobs of {pods}")
    return random.Random(seed).sample(names, count)


def run_replay_sweep(nodes: Path, pods: list[Path], policies: list[str], seeds: list[int], out: Path, jobs: int,
                     options: ReplayOptions, command: str, quiet: bool = False) -> dict[str, object]:
    for policy in policies:
        placement_profile(policy, installed_registry())
    _replay_inputs(nodes, pods)
    if options.queues and options.queues != TENANTS:
        strided = list(load_nodes(str(nodes)))[:: options.node_stride]
        fit_guarantees(load_queues(options.queues), strided, options.scale_guarantees, options.queues)
    out.mkdir(parents=True, exist_ok=True)
    # the unperturbed run first (None), then one per job left out
    left_out = {(p, seed): [None, *left_out_jobs(p, seed, options.leave_one_out)] for p in pods for seed in seeds}
    tasks = [ReplayTask(str(nodes), str(p), policy, seed, options.tick_s, options.sample_s, options.timing,
                        options.consolidate, profile, options.queues, options.assign, options.time_scale,
                        options.node_stride, left_out[(p, seed)][k], options.exact_estimates, options.submitted,
                        options.warmup_s, options.cooldown_s, options.scale_guarantees, options.jitter_s,
                        options.profiles != (None,) and len(policies) > 1)
             for p in pods for k in range(options.leave_one_out + 1) for profile in options.profiles
             for policy in policies for seed in seeds]
    results = run_all(replay_task, tasks, jobs, "replays", quiet)
    samples = [row for s, _, _, _ in results for row in s]
    replay_report.write_csv(out / "results.csv", replay_report.SAMPLE_COLUMNS, samples)
    job_rows = [r for _, j, _, _ in results for r in j]
    replay_report.write_csv(out / "jobs.csv", replay_report.JOB_COLUMNS, job_rows)
    if options.queues:
        replay_report.write_csv(out / "queues.csv", replay_report.QUEUE_COLUMNS,
                                [r for _, _, q, _ in results for r in q])
    runs = [r for _, _, _, r in results]
    document = {"protocol": "replay", "seeds": seeds, "command": command, "tick_s": options.tick_s,
                "estimates": "exact" if options.exact_estimates else "predicted",
                "time_scale": options.time_scale, "queues": options.queues,
                "traces": _mean_summaries(runs), "runs": runs,
                "wait_regressions_vs_fifo": replay_report.wait_regressions(job_rows),
                "provenance": replay_provenance(nodes, pods, policies, seeds, options, tasks)}
    fill_report.write_summary(out, document)
    images = plots.replay_plots(out, samples)
    plots.write_report(out, "gpupool replay simulation", command, replay_table(document["traces"]), images)
    return document


def replay_provenance(nodes: Path, pods: list[Path], policies: list[str], seeds: list[int], options: ReplayOptions,
                      tasks: list[ReplayTask]) -> dict[str, object]:
    inputs: list[str | Path] = [nodes, *pods, *([options.queues] if options.queues and options.queues != TENANTS
                                                 else [])]
    profiles = {t.label: profile_config(resolved_profile(t)) for t in tasks if t.leave_out is None}
    config = {"protocol": "replay", "nodes": str(nodes), "pods": [str(p) for p in pods], "policies": policies,
              "options": asdict(options), "profiles": dict(sorted(profiles.items()))}
    return provenance(inputs, config, seeds)


def replay_table(traces: dict[str, dict[str, dict[str, object]]]) -> str:
    lines = ["| trace | policy | mean wait (s) | p99 wait (s) | GAR over the window | GAR over the run | jobs started "
             "| quota violations | worst fair-share deviation (%) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for trace, policies in traces.items():
        for policy, e in policies.items():
            lines.append(f"| {trace} | {policy} | {e.get('mean_wait_s', '')} | {e.get('p99_wait_s', '')} | "
                         f"{e.get('gar_window', '')} | {e.get('gar_run', '')} | {e.get('started', '')} | "
                         f"{e.get('quota_violations', '')} | {e.get('fair_share_max_deviation_pct', '')} |")
    return "\n".join(lines)
