"""`gpupool sim ...`: trace-driven simulations through the same scheduling core as the control plane."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

from gpupool.cli.render import error

if TYPE_CHECKING:
    from gpupool.sim.compare import Interval
from gpupool.core import PLACEMENT_PROFILES, SCHEDULING_PROFILES
from gpupool.sim.fill import NODE_ORDERS, NodeOrder
from gpupool.sim.sweep import parse_seeds
from gpupool.sim.tenants import TENANTS
from gpupool.sim.traces.bounds import MAX_FILE_BYTES, check_size
from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.jobtable import read_workload
from gpupool.sim.traces.openb import read_nodes

app = typer.Typer(no_args_is_help=True, help="Simulate scheduling policies on cluster traces.")
console = Console()
_debug = False


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show the traceback of an unexpected error")) -> None:
    global _debug
    _debug = debug


@contextlib.contextmanager
def _reported(*expected: type[Exception]) -> Iterator[None]:
    """Errors as one line: a bad input file (TraceError: `file:line: column: what`) or one of `expected` exits 2;
    anything else exits 1 and says that --debug shows its traceback (with --debug it propagates)."""
    try:
        yield
    except (typer.Exit, typer.Abort, TyperException):  # usage errors: typer reports them
        raise
    except (TraceError, *expected) as exc:
        error(str(exc))
        raise typer.Exit(2) from None
    except Exception as exc:
        if _debug:
            raise
        error(f"unexpected {type(exc).__name__}: {str(exc)[:500]} (`gpupool sim --debug ...` shows where)")
        raise typer.Exit(1) from None


def _policies(text: str) -> list[str]:
    from gpupool.core import installed_registry, placement_profile

    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise typer.BadParameter(f"no policy in {text!r}", param_hint="--policy")
    registry = installed_registry()
    for name in names:
        try:
            placement_profile(name, registry)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).removeprefix("policy: "), param_hint="--policy") from None
    return names


def _profiles(text: str | None, queues: Path | None) -> tuple[str | None, ...]:
    from gpupool.core import installed_registry, scheduling_profile

    if text is None:
        return (None,)
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise typer.BadParameter(f"no profile in {text!r}", param_hint="--profile")
    registry = installed_registry()
    for name in names:
        try:
            scheduling_profile(name, "best", registry)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).removeprefix("profile: "), param_hint="--profile") from None
    if queues is None:
        raise typer.BadParameter("multi-tenant profiles need --queues", param_hint="--profile")
    return tuple(names)


def _demand(text: str) -> Fraction:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise typer.BadParameter(f"{text!r} is not a number", param_hint="--demand") from None
    if not 0 < value <= 10:
        raise typer.BadParameter("must be in (0, 10]", param_hint="--demand")
    return value


def _seeds(text: str) -> list[int]:
    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--seeds: "), param_hint="--seeds") from None


def _node_order(text: str) -> NodeOrder:
    for order in NODE_ORDERS:
        if text == order:
            return order
    raise typer.BadParameter(f"{text}: must be one of {', '.join(NODE_ORDERS)}", param_hint="--node-order")


def _existing(path: Path, option: str) -> Path:
    if not path.is_file():
        raise typer.BadParameter(f"{path}: no such file", param_hint=option)
    return path


@app.command()
def fill(
    nodes: Path = typer.Option(..., help="node list CSV (openb format)"),
    pods: list[Path] = typer.Option(..., help="pod list CSV (openb format); repeat for several traces"),
    policy: str = typer.Option("fgd", help="placement policies, comma-separated"),
    seeds: str = typer.Option("42", help="seeds: 42-51 or 1,2,3"),
    demand: str = typer.Option("1.3", help="target GPU demand as a multiple of cluster capacity"),
    out: Path = typer.Option(Path("sim-out"), help="output folder"),
    jobs: int = typer.Option(os.cpu_count() or 1, min=1, show_default="one per CPU", help="parallel processes"),
    timing: bool = typer.Option(True, help="record decisions_per_s (wall clock; --no-timing makes "
                                "results.csv byte-identical across runs)"),
    quiet: bool = typer.Option(False, help="no progress bar"),
    node_order: str = typer.Option("shuffled", help="ties between equal nodes: 'shuffled' (a seeded random node "
                                   "order per run, as the paper's simulator) or 'name' (node names, as the live "
                                   "scheduler)"),
) -> None:
    """FGD-paper protocol: submit pods one at a time until `demand` x capacity, no departures."""
    from gpupool.sim.experiment import run_fill_sweep

    _existing(nodes, "--nodes")
    for p in pods:
        _existing(p, "--pods")
    with _reported():
        summary = run_fill_sweep(nodes, pods, _policies(policy), _seeds(seeds), _demand(demand), out, jobs,
                                 timing, shlex.join(["gpupool", *sys.argv[1:]]), quiet, _node_order(node_order))
    _print_summary([(out, summary)])
    console.print(f"results: {out / 'results.csv'}\nreport:  {out / 'report.md'}")


@app.command()
def bound(
    nodes: Path = typer.Option(..., help="node list CSV (openb format)"),
    pods: list[Path] = typer.Option(..., help="pod list CSV (openb format); repeatable"),
    demand: str = typer.Option("1.0,1.3", help="arrived demand levels (multiples of capacity), comma-separated"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """LP-relaxation upper bound on GPU allocation at each demand level (scipy HiGHS)."""
    from gpupool.sim.bound import lp_bound

    _existing(nodes, "--nodes")
    levels = [_demand(d.strip()) for d in demand.split(",") if d.strip()]
    with _reported(ValueError):
        node_list = read_nodes(nodes)
        results = [(p, level, lp_bound(node_list, [q.shape for q in read_workload(_existing(p, "--pods"))], level))
                   for p in pods for level in levels]
    if as_json:
        console.print_json(json.dumps([{"pods": str(p), "demand": str(level), "bound_pct": round(b.pct, 3),
                                        "bound_gpus": round(b.allocated_milli / 1000, 1),
                                        "capacity_gpus": b.capacity_milli // 1000} for p, level, b in results]))
        return
    table = Table(title="LP upper bound on GPU allocation")
    for column in ("pods", "demand", "bound (%)", "bound (GPUs)", "capacity (GPUs)"):
        table.add_column(column)
    for p, level, b in results:
        table.add_row(p.name, f"{float(level):g}", f"{b.pct:.2f}", f"{b.allocated_milli / 1000:.1f}",
                      str(b.capacity_milli // 1000))
    console.print(table)


@app.command()
def compare(dirs: list[Path] = typer.Argument(..., help="output folders of earlier runs"),
            as_json: bool = typer.Option(False, "--json", help="print JSON"),
            per_queue: bool = typer.Option(False, help="replays: also each queue's wait, JCT and bounded slowdown")
            ) -> None:
    """Print the policies of one or more output folders side by side."""
    loaded = []
    for d in dirs:
        path = d / "summary.json"
        if not path.is_file():
            raise typer.BadParameter(f"{path}: not found (is {d} a gpupool sim output folder?)", param_hint="DIRS")
        with _reported():
            loaded.append((d, _summary(path)))
    if as_json:
        console.print_json(json.dumps({str(d): s for d, s in loaded}))
        return
    _print_summary(loaded, per_queue)


def _summary(path: Path) -> dict[str, object]:
    """An earlier run's summary.json, checked to be shaped as one (traces -> policies -> figures)."""
    check_size(path, MAX_FILE_BYTES)
    try:
        document = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise TraceError(str(path), exc.lineno, "-", f"not valid JSON: {exc.msg}") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else "not UTF-8"
        raise TraceError(str(path), 1, "-", f"not valid JSON: {problem}") from None
    traces = document.get("traces") if isinstance(document, dict) else None
    if not isinstance(traces, dict) or not all(isinstance(policies, dict) and all(map(_figures, policies.values()))
                                               for policies in traces.values()):
        raise TraceError(str(path), 1, "traces", "not a gpupool sim summary (traces -> policies -> figures)")
    return document


def _figures(entry: object) -> bool:
    """A policy's figures as `_print_summary` reads them: a mapping, whose fill levels are mappings with a numeric
    mean (a replay's figures have no levels)."""
    levels = [entry.get(level, {}) for level in ("at_100", "at_130")] if isinstance(entry, dict) else [None]
    return all(isinstance(level, dict) and type(level.get("mean", 0)) in (int, float) for level in levels)


def _print_summary(loaded: list[tuple[Path, dict[str, object]]], per_queue: bool = False) -> None:
    """Each output's figures per trace, one column per policy, as mean [95% interval] over seeds; a fill summary
    from before per-seed figures were kept prints as mean ± sd."""
    from gpupool.sim.compare import fewest_seeds, fill_intervals, queues_of, replay_intervals

    seeds: list[int] = []
    identical: list[bool] = []
    for d, summary in loaded:
        traces = summary.get("traces", {})
        assert isinstance(traces, dict)
        runs = summary.get("runs")
        runs = [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else None
        tables = replay_intervals(runs) if runs is not None else fill_intervals(traces)
        if not tables:
            _print_fill_sd(d, traces)
            continue
        seeds.append(fewest_seeds(tables))
        identical.append(all(i.lo == i.hi for m in tables.values() for per in m.values() for i in per.values())
                         and fewest_seeds(tables) > 1)
        _print_tables(d, tables, "")
        if per_queue and runs is not None:
            for queue in queues_of(runs):
                _print_tables(d, replay_intervals(runs, queue), f", queue {queue}")
    if identical and all(identical):
        console.print("[yellow]note: every seed gave the same figures (zero-width intervals): the replay is "
                      "deterministic; --jitter-s samples nearby workloads, so that the intervals mean "
                      "something[/yellow]")
    if seeds and min(seeds) < 2:
        console.print("[yellow]warning: one seed: no confidence interval, and no sign of how much the figures move "
                      "between seeds; run at least 3 (--seeds 42-44)[/yellow]")


def _print_tables(d: Path, tables: dict[str, dict[str, dict[str, Interval]]], what: str) -> None:
    from gpupool.sim.compare import fewest_seeds

    for trace, metrics in tables.items():
        policies = sorted({p for per in metrics.values() for p in per})
        seeds = fewest_seeds({trace: metrics})
        table = Table(title=f"{d} · {trace}{what}: mean [95% confidence interval] over {seeds} seed"
                      f"{'s' if seeds != 1 else ''} (docs: Simulator, Replay: Metrics)")
        table.add_column("figure")
        for policy in policies:
            table.add_column(policy, justify="right")
        for label, per in metrics.items():
            table.add_row(label, *(per[p].text() if p in per else "" for p in policies))
        console.print(table)


def _print_fill_sd(d: Path, traces: dict[str, dict[str, dict[str, object]]]) -> None:
    table = Table(title="GPU allocation (%) by arrived demand, mean ± sd over seeds")
    for column in ("run", "trace", "policy", "@100", "@130", "unallocated GPUs @130", "LP bound @130",
                   "gap GPUs @130"):
        table.add_column(column, justify="left" if column in ("run", "trace", "policy") else "right")
    for trace, policies in traces.items():
        ranked = sorted(policies.items(), key=lambda kv: -kv[1].get("at_130", {}).get("mean", 0))
        for policy, levels in ranked:
            a, b = levels.get("at_100", {}), levels.get("at_130", {})
            bound = b.get("lp_bound", b.get("capacity_bound", ""))
            table.add_row(str(d), trace, policy, f"{a.get('mean', '')} ± {a.get('sd', '')}",
                          f"{b.get('mean', '')} ± {b.get('sd', '')}", str(b.get("unallocated_gpus", "")),
                          str(bound), str(b.get("gap_gpus_to_lp_bound", "")))
    console.print(table)


@app.command()
def demo(trace_dir: Path = typer.Option(Path("../shared/traces/alibaba-gpu-v2023"),
                                        help="folder with the openb CSVs; a synthetic cluster is used if absent"),
         out: Path = typer.Option(Path("demo-out"), help="output folder")) -> None:
    """A one-minute tour: FGD, BestFit and Random on the openb trace (or a synthetic cluster)."""
    from gpupool.sim.experiment import run_fill_sweep
    from gpupool.sim.synthetic import write_synthetic

    nodes, pods = trace_dir / "openb_node_list_gpu_node.csv", trace_dir / "openb_pod_list_default.csv"
    if not (nodes.is_file() and pods.is_file()):
        console.print(f"[yellow]{trace_dir} has no openb trace; using a synthetic cluster[/yellow]")
        nodes, pods = write_synthetic(out / "synthetic")
    command = f"gpupool sim fill --nodes {nodes} --pods {pods} --policy fgd,bestfit,random --seeds 42 --out {out}"
    with _reported():
        summary = run_fill_sweep(nodes, [pods], ["fgd", "bestfit", "random"], [42], Fraction(13, 10), out,
                                 min(3, os.cpu_count() or 1), True, command)
    _print_summary([(out, summary)])
    console.print(f"\nReport: [bold]{out / 'report.md'}[/bold] (plots: {out}/alloc_*.png)\n"
                  f"Next: all policies over ten seeds:\n  {sys.argv[0]} sim fill --nodes {nodes} --pods {pods} "
                  f"--policy {','.join(PLACEMENT_PROFILES)} --seeds 42-51 --out sweep-out")


@app.command()
def replay(
    nodes: Path = typer.Option(..., help="node list CSV (openb format)"),
    pods: list[Path] = typer.Option(..., help="pod list CSV with creation/deletion times; repeatable"),
    policy: str = typer.Option("best", help="placement policies, comma-separated"),
    seeds: str = typer.Option("42", help="seeds: 42-51 or 1,2,3"),
    out: Path = typer.Option(Path("sim-out"), help="output folder"),
    tick_s: float = typer.Option(0.0, min=0.0, help="at most one scheduling cycle per this many simulated seconds"),
    sample_s: float = typer.Option(3600.0, min=1.0, help="cluster sample period in simulated seconds"),
    jobs: int = typer.Option(os.cpu_count() or 1, min=1, show_default="one per CPU", help="parallel processes"),
    timing: bool = typer.Option(True, help="record cycle latency and decisions/s (wall clock)"),
    consolidate: bool = typer.Option(False, help=(
        "move tasks to start blocked jobs, right after allocate: checkpointable ones resume; a job that cannot "
        "checkpoint starts over, so only tasks in their first 10 min move (replaces fair-share's moves for jobs "
        "waiting over 2 h)")),
    max_moves_per_cycle: int = typer.Option(8, min=0, help="consolidation budget per cycle"),
    max_moves_per_hour: int = typer.Option(60, min=0, help="consolidation budget per simulated hour"),
    queues: Path | None = typer.Option(None, help="queue tree YAML (docs: Queues and quotas), or `tenants`: one "
                                                  "queue per tenant of the trace (docs: Trace files); enables quotas "
                                                  "and fair share"),
    assign: str = typer.Option("hash", help="how jobs map to leaf queues: hash (stable hash of the name) or "
                               "column (the pod list's queue column)"),
    profile: str | None = typer.Option(None, help="multi-tenant profiles, comma-separated: "
                                       + ", ".join(SCHEDULING_PROFILES)),
    time_scale: float = typer.Option(1.0, min=1e-6, help="divide arrival times by this (raises the load)"),
    node_stride: int = typer.Option(1, min=1, help="use every K-th node of the node list (a smaller cluster)"),
    leave_one_out: int = typer.Option(0, min=0, help=(
        "also replay every profile N more times, each with one job of the trace left out (drawn with the seed); "
        "summary.json then compares each with fifo without the same job, and fifo with fifo: how far one job's "
        "absence moves the per-job comparison")),
    estimates: str = typer.Option("predicted", help=(
        "runtime estimates: predicted (from past jobs of the same user, queue and shape, as in production) or "
        "exact (each job's true duration: an oracle bound on what better estimates could buy)")),
    submitted: str = typer.Option("", help="replay only jobs submitted in FROM,UNTIL (trace clock: whole seconds or "
                                  "ISO-8601 times such as 2017-10-02; either side may be empty)"),
    scale_guarantees: bool = typer.Option(False, help="scale the queue file's guarantees and limits down to the "
                                          "simulated cluster instead of refusing guarantees above its GPUs"),
    jitter_s: float = typer.Option(0.0, min=0.0, help="delay each job's submission by a seeded uniform draw in "
                                   "[0, S) seconds, so that seeds sample nearby workloads (docs: Replay, Metrics)"),
    warmup_s: float = typer.Option(0.0, min=0.0, help="measurement window: starts this long after the first "
                                   "submission (docs: Replay, Metrics)"),
    cooldown_s: float = typer.Option(0.0, min=0.0, help="measurement window: ends this long before the last "
                                     "submission"),
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Time-based replay: arrivals and departures from the trace, a pending queue retried each cycle."""
    from gpupool.sim.experiment import ReplayOptions, run_replay_sweep

    _existing(nodes, "--nodes")
    for p in pods:
        _existing(p, "--pods")
    if queues is not None and str(queues) != TENANTS:
        _existing(queues, "--queues")
    if assign not in ("hash", "column"):
        raise typer.BadParameter("must be hash or column", param_hint="--assign")
    if estimates not in ("predicted", "exact"):
        raise typer.BadParameter("must be predicted or exact", param_hint="--estimates")
    options = ReplayOptions(tick_s, sample_s, timing, (max_moves_per_cycle, max_moves_per_hour) if consolidate
                            else None, _profiles(profile, queues), str(queues) if queues else None, assign, time_scale,
                            node_stride, leave_one_out, estimates == "exact", _submitted(submitted),
                            warmup_s, cooldown_s, scale_guarantees, jitter_s)
    with _reported():
        _enough_jobs(pods, leave_one_out)
        summary = run_replay_sweep(nodes, pods, _policies(policy), _seeds(seeds), out, jobs, options,
                                   shlex.join(["gpupool", *sys.argv[1:]]), quiet)
    table = Table(title="Replay: waits and allocation, mean over seeds")
    for column in ("trace", "policy", "mean wait s", "p99 wait s", "GAR", "started", "cycle p99 ms", "migrations/h",
                   "GPUs per migration", "quota violations", "fair-share worst dev %"):
        table.add_column(column)
    traces = summary["traces"]
    assert isinstance(traces, dict)
    for trace, policies in traces.items():
        for name, e in policies.items():
            table.add_row(trace, name, *(str(e.get(k, "")) for k in
                                         ("mean_wait_s", "p99_wait_s", "gar_window", "started", "cycle_p99_ms",
                                          "migrations_per_hour", "gpus_recovered_per_migration", "quota_violations",
                                          "fair_share_max_deviation_pct")))
    console.print(table)
    _print_summary([(out, summary)])
    console.print(f"results: {out / 'results.csv'}\njobs:    {out / 'jobs.csv'}\nreport:  {out / 'report.md'}")


def _submitted(text: str) -> tuple[int | None, int | None]:
    from gpupool.sim.traces.jobtable import parse_time

    if not text.strip():
        return None, None
    parts = text.split(",")
    if len(parts) != 2:
        raise typer.BadParameter("give FROM,UNTIL (either may be empty)", param_hint="--submitted")
    try:
        begin, end = (parse_time(p)[0] if p.strip() else None for p in parts)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--submitted") from None
    if begin is not None and end is not None and end <= begin:
        raise typer.BadParameter("UNTIL must be after FROM", param_hint="--submitted")
    return begin, end


def _enough_jobs(pods: list[Path], leave_one_out: int) -> None:
    from gpupool.sim.experiment import load_pods

    if not leave_one_out:
        return
    for p in pods:
        count = len(load_pods(str(p)))
        if leave_one_out > count:
            raise typer.BadParameter(f"{leave_one_out} is more than the {count} jobs of {p}",
                                     param_hint="--leave-one-out")


@app.command()
def generate(
    nodes: Path = typer.Option(..., help="node list CSV: the cluster the load is computed for"),
    queues: Path = typer.Option(..., help="queue tree YAML; jobs go to its leaf queues"),
    out: Path = typer.Option(Path("workload.csv"), help="pod list CSV to write (openb format + queue columns)"),
    source: Path = typer.Option(Path("../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv"),
                                help="pod list whose shapes and durations are drawn"),
    shares: str = typer.Option("", help="tenant shares, e.g. vision=0.4,nlp=0.3 (default: equal)"),
    load: float = typer.Option(0.9, help="offered load: requested GPU-seconds per second over cluster GPUs"),
    days: float = typer.Option(3.0, help="length of the arrival window in days"),
    gang_share: float = typer.Option(0.05, help="share of jobs that are gangs of 2-8 tasks"),
    limit_share: float = typer.Option(0.5, help="share of jobs with a runtime limit (1-3x their duration)"),
    seed: int = typer.Option(0, help="random seed"),
    node_stride: int = typer.Option(1, min=1, help="size the load for every K-th node only"),
    scale_guarantees: bool = typer.Option(False, help="scale the queue file's guarantees and limits down to the "
                                          "simulated cluster instead of refusing guarantees above its GPUs"),
) -> None:
    """Write a multi-tenant workload drawn from a trace's shapes and durations at a target load inside the window."""
    from dataclasses import asdict

    from gpupool.sim.generate import WorkloadSpec
    from gpupool.sim.generate import generate as write_workload
    from gpupool.sim.provenance import provenance
    from gpupool.sim.tenants import fit_guarantees, load_queues

    _existing(nodes, "--nodes")
    _existing(queues, "--queues")
    _existing(source, "--source")
    with _reported(ValueError):
        tree = load_queues(queues)
        weights = _shares(shares, tree.leaves, queues)
        spec = WorkloadSpec(load=load, days=days, gang_share=gang_share, limit_share=limit_share, seed=seed)
        simulated = read_nodes(nodes)[::node_stride]
        fit_guarantees(tree, simulated, scale_guarantees, str(queues))
        made = write_workload(read_workload(source), sum(len(n.gpus) for n in simulated), weights, spec, out)
    replay_out = out.with_name(out.stem + "-replay")
    command = ["gpupool", "sim", "replay", "--nodes", str(nodes), "--pods", str(out), "--queues", str(queues),
               "--assign", "column", "--profile", "fifo,default", "--node-stride", str(node_stride),
               *(["--scale-guarantees"] if scale_guarantees else []), "--warmup-s", str(made.warmup_s),
               "--out", str(replay_out)]
    summary = {"protocol": "generate", "workload": str(out), "jobs": made.jobs, "seed": seed,
               "target_load": load, "offered_load_in_window": round(made.offered_load, 4),
               "window_s": [made.warmup_s, made.warmup_s + made.window_s], "capacity_gpus": made.capacity_gpus,
               "node_stride": node_stride, "max_duration_s": made.max_duration_s, "next": shlex.join(command),
               "provenance": provenance([nodes, queues, source], {**asdict(spec), "shares": weights,
                                                                  "node_stride": node_stride,
                                                                  "scale_guarantees": scale_guarantees}, [seed])}
    out.with_name(out.stem + ".summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    console.print(f"wrote {made.jobs} jobs to {out}: offered load inside the window [{made.warmup_s}, "
                  f"{made.warmup_s + made.window_s}) s: {made.offered_load:.3f} of {made.capacity_gpus} GPUs (target "
                  f"{load:g}); durations capped at {made.max_duration_s} s, arrivals from that long before the window, "
                  f"jobs cut at its end\nnext: {shlex.join(command)}")


def _shares(text: str, leaves: list[str], queues: Path) -> dict[str, float]:
    weights = {leaf: 1.0 for leaf in leaves}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in weights:
            raise typer.BadParameter(f"{name!r} is not a leaf queue of {queues}", param_hint="--shares")
        weights[name] = float(value)
    return weights
