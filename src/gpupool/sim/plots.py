"""Plots and the Markdown report of a simulation output folder (matplotlib, Agg backend)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

#: (xs, mean over seeds, 95% interval low, high, seeds) of one policy's curve
Curve = tuple[list[float], list[float], list[float], list[float], int]
#: line styles and markers cycled over policies, so that a line hidden under another still shows its marks
STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 1)), "P"))


def mean_curves(rows: Sequence[dict[str, str]], x: str, y: str) -> dict[str, dict[str, Curve]]:
    """trace -> policy -> (xs, mean of y over seeds at each x, its 95% t-interval, seeds)."""
    from gpupool.sim.compare import interval

    acc: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    seeds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for row in rows:
        if row.get(y, "") != "":
            acc[(row["trace"], row["policy"], float(row[x]))].append(float(row[y]))
            seeds[(row["trace"], row["policy"])].add(row.get("seed", ""))
    curves: dict[str, dict[str, Curve]] = defaultdict(dict)
    for (trace, policy, xv), ys in sorted(acc.items()):
        xs, means, lows, highs, _ = curves[trace].setdefault(policy, ([], [], [], [], len(seeds[(trace, policy)])))
        ci = interval(ys)
        xs.append(xv)
        means.append(ci.mean)
        lows.append(ci.lo)
        highs.append(ci.hi)
    return curves


def line_plot(path: Path, curves: dict[str, Curve], title: str, xlabel: str, ylabel: str, definition: str,
              bound: str | None = None, counts: bool = False) -> Path:
    """Mean curves with 95% bands (over seeds, where there are two or more) and the seed count in each label,
    a style and marker per policy, `definition` printed under the plot; `bound` draws the capacity bound
    min(x, 100) with that label; `counts` gives the y axis whole-number ticks."""
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    for k, (policy, (xs, ys, lows, highs, seeds)) in enumerate(curves.items()):
        style, marker = STYLES[k % len(STYLES)]
        line, = ax.plot(xs, ys, label=f"{policy} (n={seeds} seed{'s' if seeds != 1 else ''})", linewidth=1.4,
                        linestyle=style, marker=marker, markersize=4, markevery=max(1, len(xs) // 12))
        if seeds > 1:
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15, linewidth=0)
    if bound is not None:
        top = max(max(c[0]) for c in curves.values())
        knee = min(top, 100)
        ax.plot([0, knee, top], [0, knee, knee], color="grey", linestyle=":", linewidth=1, label=bound)
    if counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, definition + "; shaded: 95% confidence interval over seeds (Student's t)", fontsize=7,
             wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def fill_plots(out: Path, rows: Sequence[dict[str, str]]) -> list[Path]:
    """Per trace: allocation vs arrived demand (FGD paper Fig. 9a) and fragmentation vs arrived."""
    paths = []
    alloc = mean_curves(rows, "arrived_pct", "gpu_alloc_pct")
    frag = mean_curves(rows, "arrived_pct", "frag_pct")
    for trace in alloc:
        paths.append(line_plot(out / f"alloc_{trace}.png", alloc[trace], f"GPU allocation ratio, {trace}",
                               "arrived GPU demand (% of capacity)", "GPU allocation (%)",
                               "GPU allocation: allocated GPUs / cluster GPUs, mean over the decisions at each arrived "
                               "percent", bound="capacity bound: min(arrived, 100 %), what no policy can exceed"))
        paths.append(line_plot(out / f"frag_{trace}.png", frag[trace], f"GPU fragmentation (FGD's F(M)), {trace}",
                               "arrived GPU demand (% of capacity)", "fragmentation (% of cluster GPUs)",
                               "fragmentation: the FGD paper's F(M), idle GPU that the target workload's tasks "
                               "cannot use, % of cluster GPUs"))
    return paths


def write_report(out: Path, title: str, command: str, table_md: str, images: Sequence[Path]) -> Path:
    lines = [f"# {title}", "", "Command:", "", "```", command, "```", "", table_md, ""]
    lines += [f"![{p.stem}]({p.name})" for p in images]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def replay_plots(out: Path, rows: Sequence[dict[str, str]]) -> list[Path]:
    """Per trace: GPU allocation and pending jobs over simulated time (hours), mean over seeds."""
    paths = []
    hours = [{**r, "time_h": str(float(r["time_s"]) / 3600)} for r in rows]
    alloc = mean_curves(hours, "time_h", "gpu_alloc_pct")
    pending = mean_curves(hours, "time_h", "pending_jobs")
    for trace in alloc:
        paths.append(line_plot(out / f"alloc_{trace}.png", alloc[trace], f"GPU allocation over time, {trace}",
                               "simulated time (h)", "GPU allocation (%)",
                               "GPU allocation: allocated GPUs / schedulable cluster GPUs at each sample"))
        paths.append(line_plot(out / f"pending_{trace}.png", pending[trace], f"Pending jobs, {trace}",
                               "simulated time (h)", "pending jobs",
                               "pending jobs: jobs submitted and not running at each sample", counts=True))
    return paths
