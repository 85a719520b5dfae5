"""Fill sweep on openb and its distance to the FGD artifact's published per-seed results.

Each difference comes with its noise: the half-width of a 95 % confidence interval of a difference of two
independent means, ours over our seeds and the artifact's over the same seed numbers (the two simulators draw
different pod orders and node names from one seed, so runs pair by number only, not by draw). One run's allocation
at 100 % varies from seed to seed by 0.3 to 0.7 points (sd) on the saturating traces, so two 10-seed means differ
by up to about +-0.5 by chance, and a 3-seed estimate of that noise is itself unreliable: a difference inside its
noise is no evidence of a difference in semantics (docs/benchmarks/fill-fidelity.md, "What was left").
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

from gpupool.sim.experiment import run_fill_sweep
from gpupool.sim.sweep import parse_seeds

PUBLISHED_NAMES = {"01-Random": "random", "02-DotProd": "dotprod", "03-GpuClustering": "gpuclustering",
                   "04-GpuPacking": "gpupacking", "05-BestFit": "bestfit", "06-FGD": "fgd"}
TOLERANCE = 0.5


def published_means(path: Path, seeds: set[int]) -> dict[tuple[str, str, int], tuple[float, float, int]]:
    """(trace, policy, level) -> (mean, sample sd, number of seeds) over the requested seeds of the artifact's
    allocation %; the sd is 0.0 for a single seed."""
    values: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if int(row["seed"]) not in seeds:
                continue
            trace = row["workload"].removeprefix("openb_pod_list_")
            for level in (100, 130):
                values[(trace, PUBLISHED_NAMES[row["sc_policy"]], level)].append(float(row[str(level)]))
    return {k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for k, v in values.items()}


def noise(sd_ours: float, n_ours: int, sd_published: float, n_published: int) -> float:
    """Half the width of a 95 % confidence interval of (our mean - the published mean), two independent samples of
    unequal spread (Welch: t(0.975, Welch-Satterthwaite df) x standard error); +inf below 2 seeds on either side."""
    from scipy import stats

    if min(n_ours, n_published) < 2:
        return math.inf
    a, b = sd_ours ** 2 / n_ours, sd_published ** 2 / n_published
    if a + b == 0:
        return 0.0
    df = (a + b) ** 2 / (a ** 2 / (n_ours - 1) + b ** 2 / (n_published - 1))
    return float(stats.t.ppf(0.975, df)) * math.sqrt(a + b)


def run(openb: Path, published: Path, traces: list[str], policies: list[str], seeds: str, jobs: int,
        out: Path) -> None:
    pods = [openb / f"openb_pod_list_{t}.csv" for t in traces]
    command = (f"gpupool sim fill --nodes {openb / 'openb_node_list_gpu_node.csv'} "
               + " ".join(f"--pods {p}" for p in pods) + f" --policy {','.join(policies)} --seeds {seeds} "
               f"--jobs {jobs} --out {out}")
    started = time.perf_counter()
    summary = run_fill_sweep(openb / "openb_node_list_gpu_node.csv", pods, policies, parse_seeds(seeds),
                             Fraction(13, 10), out, jobs, True, command)
    elapsed = time.perf_counter() - started
    reference = published_means(published, set(parse_seeds(seeds)))
    policies_compared = [p for p in policies if p in PUBLISHED_NAMES.values()]
    lines = ["| trace | policy | ours @100 | published @100 | Δ | ours @130 | published @130 | Δ | noise (95 %) "
             "| within ±0.5 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|:-:|"]
    misses = unresolved = 0
    traces_summary = summary["traces"]
    assert isinstance(traces_summary, dict)
    for trace in traces:
        for policy in policies_compared:
            levels = traces_summary[trace][policy]
            cells, ok, noises, resolved = [], True, [], False
            for level in (100, 130):
                ours = levels[f"at_{level}"]
                ref = reference.get((trace, policy, level))
                delta = ours["mean"] - ref[0] if ref is not None else None
                ok &= delta is None or abs(delta) <= TOLERANCE
                cells += [f"{ours['mean']:.2f}", f"{ref[0]:.2f}" if ref is not None else "-",
                          f"{delta:+.2f}" if delta is not None else "-"]
                if ref is not None and delta is not None:
                    level_noise = noise(ours["sd"], ours["seeds"], ref[1], ref[2])
                    resolved |= abs(delta) > TOLERANCE and abs(delta) > level_noise
                    noises.append(f"{level_noise:.2f}")
            misses += not ok
            unresolved += not ok and not resolved
            lines.append(f"| {trace} | {policy} | " + " | ".join(cells) + f" | {' / '.join(noises) or '-'} "
                         f"| {'yes' if ok else 'NO'} |")
    report = "\n".join(lines) + best_against_fgd(traces_summary, traces)
    (out / "fidelity.md").write_text(f"Command: `{command}`\n\nWall time: {elapsed:.0f} s\n\n{report}\n")
    print(report)
    print(f"\n{misses} of {len(traces) * len(policies_compared)} (trace, policy) pairs outside ±{TOLERANCE}, "
          f"{unresolved} of them within their noise (more seeds needed to tell); "
          f"sweep wall time {elapsed:.0f} s with {jobs} processes\ncommand: {command}\n"
          f"written: {out / 'fidelity.md'}, {out / 'report.md'}")


def best_against_fgd(summary: dict[str, dict[str, dict[str, dict[str, float]]]], traces: list[str]) -> str:
    """Markdown: gpupool's `best` beside `fgd` per trace at 100 % and 130 % (empty unless both ran)."""
    if not all({"best", "fgd"} <= summary[t].keys() for t in traces):
        return ""
    lines = ["", "", "| trace | best @100 | fgd @100 | Δ | best @130 | fgd @130 | Δ |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    wins = 0
    for trace in traces:
        cells, won = [], True
        for level in (100, 130):
            best, fgd = (summary[trace][p][f"at_{level}"]["mean"] for p in ("best", "fgd"))
            won &= best > fgd
            cells += [f"{best:.2f}", f"{fgd:.2f}", f"{best - fgd:+.2f}"]
        wins += won
        lines.append(f"| {trace} | " + " | ".join(cells) + " |")
    lines.append(f"\n`best` beats `fgd` at both levels on {wins} of {len(traces)} traces.")
    return "\n".join(lines)
