"""`gpupool sim compare`: the figures of fill, replay and generate outputs, per policy, with 95% confidence
intervals over seeds (Student's t, scipy). One seed gives no interval, and the caller warns."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: replay figures `sim compare` prints: label -> path in a run's summary (see `replay_metrics`)
REPLAY_METRICS: dict[str, tuple[str, ...]] = {
    "wait p50 (s)": ("window", "wait_s", "p50"),
    "wait p99 (s)": ("window", "wait_s", "p99"),
    "wait max (s)": ("window", "wait_s", "max"),
    "JCT p50 (s)": ("window", "jct_s", "p50"),
    "JCT p99 (s)": ("window", "jct_s", "p99"),
    "bounded slowdown p50": ("window", "bounded_slowdown", "p50"),
    "bounded slowdown p99": ("window", "bounded_slowdown", "p99"),
    "GAR over the window": ("gar_window",),
    "useful GPU-hours": ("useful_gpu_hours",),
    "redone GPU-hours": ("redone_gpu_hours",),
    "never started": ("window", "never_started"),
    "makespan (h)": ("makespan_s",),
    "fragmentation, node GFR (%)": ("gfr_nodes_pct",),
    "fragmentation, FGD rate (%)": ("fgd_frag_rate_pct",),
}
FILL_METRICS = {"allocation @100 (%)": ("at_100",), "allocation @130 (%)": ("at_130",)}
#: figures shown divided by this (seconds to hours)
SCALE = {"makespan (h)": 3600.0}


@dataclass(frozen=True, slots=True)
class Interval:
    """Mean over seeds and its 95% t-interval (lo == hi == mean with one seed)."""

    mean: float
    lo: float
    hi: float
    seeds: int

    def text(self) -> str:
        if self.seeds < 2:
            return _num(self.mean)
        return f"{_num(self.mean)} [{_num(self.lo)}, {_num(self.hi)}]"


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def interval(values: Sequence[float]) -> Interval:
    """The mean of `values` and its 95% confidence interval: mean +- t(0.975, n-1) * sd / sqrt(n)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean, len(values))
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


def _at(run: Mapping[str, object], path: tuple[str, ...]) -> float | None:
    value: object = run
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: the figures `sim compare --per-queue` prints for each queue (paths under the run's `per_queue` -> queue)
QUEUE_METRICS = {label: path for label, path in REPLAY_METRICS.items() if path[0] == "window"}


def queues_of(runs: Sequence[Mapping[str, object]]) -> list[str]:
    """The queues the runs report figures for."""
    queues: set[str] = set()
    for run in runs:
        per_queue = run.get("per_queue")
        if isinstance(per_queue, Mapping):
            queues.update(map(str, per_queue))
    return sorted(queues)


def replay_intervals(runs: Sequence[Mapping[str, object]],
                     queue: str | None = None) -> dict[str, dict[str, dict[str, Interval]]]:
    """trace -> metric label -> policy -> interval over the runs' seeds (a metric no run has is left out); with
    `queue`, that queue's job figures."""
    grouped: dict[tuple[str, str], list[Mapping[str, object]]] = {}
    for run in runs:
        grouped.setdefault((str(run.get("trace")), str(run.get("policy"))), []).append(run)
    metrics = REPLAY_METRICS if queue is None else {k: ("per_queue", queue, *v) for k, v in QUEUE_METRICS.items()}
    out: dict[str, dict[str, dict[str, Interval]]] = {}
    for (trace, policy), items in sorted(grouped.items()):
        for label, path in metrics.items():
            values = [v / SCALE.get(label, 1.0) for v in (_at(i, path) for i in items) if v is not None]
            if values:
                out.setdefault(trace, {}).setdefault(label, {})[policy] = interval(values)
    return out


def fill_intervals(traces: Mapping[str, Mapping[str, Mapping[str, object]]]) -> dict[str, dict[str, dict[str,
                                                                                                      Interval]]]:
    """trace -> metric label -> policy -> interval, from the per-seed allocations a fill summary keeps."""
    out: dict[str, dict[str, dict[str, Interval]]] = {}
    for trace, policies in traces.items():
        for policy, levels in policies.items():
            for label, (level,) in FILL_METRICS.items():
                entry = levels.get(level)
                values = entry.get("per_seed") if isinstance(entry, Mapping) else None
                if isinstance(values, list) and values:
                    out.setdefault(trace, {}).setdefault(label, {})[policy] = interval([float(v) for v in values])
    return out


def fewest_seeds(tables: Mapping[str, Mapping[str, Mapping[str, Interval]]]) -> int:
    """The fewest seeds behind any figure (0 if none)."""
    return min((i.seeds for metrics in tables.values() for policies in metrics.values() for i in policies.values()),
               default=0)
