"""Metrics that separate policies in a replay (docs: Replay, "Metrics"), over the measurement window and the run.

Per job (times in seconds on the trace clock; `run` is the job's run time in the trace):

* wait = first start - submit (jobs that started);
* JCT (job completion time) = end - submit (jobs that finished);
* bounded slowdown = max(1, JCT / max(run, SLOWDOWN_BOUND_S)) (jobs that finished): the bound keeps jobs of a few
  seconds from dominating the figure (Feitelson's bounded slowdown, tau = 10 s).

Each is reported as mean, p50, p95, p99 (nearest rank) and max, over the jobs submitted inside the window and over
all jobs, for the whole replay and per leaf queue. Cluster figures over the window: GAR (allocated GPU-seconds /
capacity GPU-seconds), fragmentation by three named definitions averaged over the cluster samples inside it
(FRAGMENTATION), useful GPU-hours (work of finished jobs) against redone GPU-hours (work lost to evictions and to
moves of jobs that cannot checkpoint, run again), makespan (last end - first submit) and jobs never started.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from gpupool.core.metrics import nearest_rank
from gpupool.sim.replay import JobRecord, ReplayRun

SLOWDOWN_BOUND_S = 10.0
STATS = ("mean", "p50", "p95", "p99", "max")
#: fragmentation figures, by name: what each measures
FRAGMENTATION = {
    "gfr_nodes_pct": "ours (node GFR): GPU nodes with some but not all GPU idle, % of GPU nodes",
    "gfr_gpu_pct": "ours (GPU-weighted GFR): idle GPU on such nodes, % of all idle GPU",
    "fgd_frag_rate_pct": "FGD paper (Weng et al., ATC'23): fragmented GPU F(M) against the target workload, "
                         "% of idle GPU",
}


def stats(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p95, p99 (nearest rank) and max of `values`, rounded to 0.1 (None for each if empty)."""
    if not values:
        return dict.fromkeys(STATS)
    figures = [statistics.fmean(values), *(nearest_rank(values, q) for q in (50, 95, 99)), max(values)]
    return {k: round(float(v), 1) for k, v in zip(STATS, figures, strict=True)}


def job_figures(records: Iterable[JobRecord], durations: dict[str, float]) -> dict[str, object]:
    """Wait, JCT and bounded slowdown of `records` (STATS each), with the count of jobs never started."""
    records = list(records)
    waits = [r.first_start - r.submit for r in records if r.first_start is not None]
    done = [r for r in records if r.end is not None]
    jct = [r.end - r.submit for r in done]  # type: ignore[operator]
    slowdown = [max(1.0, (r.end - r.submit) / max(durations.get(r.job.id, 0.0), SLOWDOWN_BOUND_S))  # type: ignore[operator]
                for r in done]
    return {"jobs": len(records), "never_started": len(records) - len(waits), "finished": len(done),
            "wait_s": stats(waits), "jct_s": stats(jct), "bounded_slowdown": stats(slowdown)}


def _in_window(run: ReplayRun) -> list[JobRecord]:
    begin, end = run.window or (run.start, run.end)
    return [r for r in run.records.values() if begin <= r.submit < end]


def _work_hours(records: Iterable[JobRecord], durations: dict[str, float]) -> float:
    return sum(durations.get(r.job.id, 0.0) * r.gpus_milli / 1000 for r in records if r.end is not None) / 3600


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


def cluster_window_figures(run: ReplayRun) -> dict[str, object]:
    """GAR and the FRAGMENTATION figures over the window (whole run without one)."""
    begin, end = run.window or (run.start, run.end)
    area = run.window_area if run.window else run.allocated_area
    samples = [s for s in run.samples if begin <= s.time < end and s.gpu_nodes]
    idle = [(s.capacity_milli - s.allocated_milli, s) for s in samples]
    return {
        "window_s": [round(begin - run.start, 1), round(end - run.start, 1)],
        "gar_window": round(area / (run.capacity_milli * (end - begin)), 4) if end > begin else None,
        "gfr_nodes_pct": _mean([100 * s.fragmented_nodes / s.gpu_nodes for s in samples]),
        "gfr_gpu_pct": _mean([100 * s.fragmented_free_milli / free for free, s in idle if free]),
        "fgd_frag_rate_pct": _mean([100 * s.fgd_frag_milli / free for free, s in idle if free]),
        "samples_in_window": len(samples),
    }


def replay_figures(run: ReplayRun) -> dict[str, object]:
    """Everything above for one replay: `window` and `whole` job figures, per-queue ones, cluster figures."""
    window = _in_window(run)
    ends = [r.end for r in run.records.values() if r.end is not None]
    queues = sorted({r.job.queue for r in run.records.values()})
    return {
        **cluster_window_figures(run),
        "window": job_figures(window, run.durations),
        "whole": job_figures(run.records.values(), run.durations),
        "per_queue": {q: {"window": job_figures([r for r in window if r.job.queue == q], run.durations),
                          "whole": job_figures([r for r in run.records.values() if r.job.queue == q],
                                               run.durations)} for q in queues},
        "makespan_s": round(max(ends) - min(r.submit for r in run.records.values()), 1) if ends else None,
        "useful_gpu_hours": round(_work_hours(run.records.values(), run.durations), 2),
        "redone_gpu_hours": round((run.evict_lost_gpu_s + run.move_lost_gpu_s) / 3600, 2),
        "slowdown_bound_s": SLOWDOWN_BOUND_S,
    }
