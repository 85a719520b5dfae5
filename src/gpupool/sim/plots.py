"""Plots and the Markdown report of a simulation output folder (matplotlib, Agg backend)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Curve = tuple[list[float], list[float]]


def mean_curves(rows: Sequence[dict[str, str]], x: str, y: str) -> dict[str, dict[str, Curve]]:
    """trace -> policy -> (xs, mean of y over seeds at each x)."""
    acc: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    for row in rows:
        if row.get(y, "") != "":
            acc[(row["trace"], row["policy"], float(row[x]))].append(float(row[y]))
    curves: dict[str, dict[str, Curve]] = defaultdict(dict)
    for (trace, policy, xv), ys in sorted(acc.items()):
        xs, means = curves[trace].setdefault(policy, ([], []))
        xs.append(xv)
        means.append(statistics.fmean(ys))
    return curves


def line_plot(path: Path, curves: dict[str, Curve], title: str, xlabel: str,
              ylabel: str, diagonal: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for policy, (xs, ys) in curves.items():
        ax.plot(xs, ys, label=policy, linewidth=1.4)
    if diagonal:
        top = max(max(xs) for xs, _ in curves.values())
        knee = min(top, 100)
        ax.plot([0, knee, top], [0, knee, knee], color="grey", linestyle=":", linewidth=1, label="capacity bound")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
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
                               "arrived GPU demand (% of capacity)", "GPU allocation (%)", diagonal=True))
        paths.append(line_plot(out / f"frag_{trace}.png", frag[trace], f"GPU fragmentation, {trace}",
                               "arrived GPU demand (% of capacity)", "fragmentation (% of capacity)"))
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
                               "simulated time (h)", "GPU allocation (%)"))
        paths.append(line_plot(out / f"pending_{trace}.png", pending[trace], f"Pending jobs, {trace}",
                               "simulated time (h)", "pending jobs"))
    return paths
