"""Replay outputs: results.csv (cluster samples), jobs.csv (one row per job), summary.json, plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from gpupool.core.metrics import ESTIMATE_BUCKETS, WAIT_BUCKETS_S, histogram, nearest_rank
from gpupool.core.units import MILLI
from gpupool.protocol.csvsafe import SafeDictWriter
from gpupool.sim.replay import ReplayRun
from gpupool.sim.replay_metrics import replay_figures

SAMPLE_COLUMNS = ("trace", "policy", "seed", "time_s", "gpu_alloc_pct", "unallocated_gpus", "gfr_pct",
                  "pending_jobs", "running_tasks")
JOB_COLUMNS = ("trace", "policy", "seed", "job", "queue", "submit_s", "start_s", "end_s", "wait_s", "gpus",
               "preemptions", "estimate_s", "reason_last_pending")


def sample_rows(trace: str, policy: str, seed: int, run: ReplayRun) -> list[dict[str, str]]:
    rows = []
    for s in run.samples:
        alloc = s.allocated_milli / s.capacity_milli if s.capacity_milli else 0.0
        rows.append({"trace": trace, "policy": policy, "seed": str(seed), "time_s": f"{s.time - run.start:.0f}",
                     "gpu_alloc_pct": f"{100 * alloc:.2f}",
                     "unallocated_gpus": f"{(s.capacity_milli - s.allocated_milli) / 1000:.1f}",
                     "gfr_pct": f"{100 * s.fragmented_nodes / s.gpu_nodes:.2f}" if s.gpu_nodes else "0.00",
                     "pending_jobs": str(s.pending), "running_tasks": str(s.running_tasks)})
    return rows


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def job_rows(trace: str, policy: str, seed: int, run: ReplayRun) -> list[dict[str, str]]:
    rows = []
    for job_id, r in sorted(run.records.items(), key=lambda kv: (kv[1].submit, kv[0])):
        wait = None if r.first_start is None else r.first_start - r.submit
        rows.append({"trace": trace, "policy": policy, "seed": str(seed), "job": job_id, "queue": r.job.queue,
                     "submit_s": _opt(r.submit - run.start), "start_s": _opt(None if r.first_start is None
                                                                             else r.first_start - run.start),
                     "end_s": _opt(None if r.end is None else r.end - run.start), "wait_s": _opt(wait),
                     "gpus": f"{r.gpus_milli / 1000:g}", "preemptions": str(r.preemptions),
                     "estimate_s": _opt(r.job.estimate_s),
                     "reason_last_pending": r.last_reason.message if r.last_reason and r.first_start is None else ""})
    return rows


def run_summary(run: ReplayRun, timing: bool) -> dict[str, object]:
    waits = [r.first_start - r.submit for r in run.records.values() if r.first_start is not None]
    span = run.end - run.start
    summary: dict[str, object] = {
        "jobs": len(run.records), "started": len(waits),
        "never_started": len(run.records) - len(waits),
        "rejected": sum(1 for r in run.records.values() if r.rejected),
        "preemptions": sum(r.preemptions for r in run.records.values()),
        "mean_wait_s": round(statistics.fmean(waits), 1) if waits else None,
        "p50_wait_s": nearest_rank(waits, 50) if waits else None,
        "p90_wait_s": nearest_rank(waits, 90) if waits else None,
        "p99_wait_s": nearest_rank(waits, 99) if waits else None,
        "max_wait_s": max(waits) if waits else None,
        "jwtd_buckets": histogram(waits, WAIT_BUCKETS_S),
        "gar_run": round(run.allocated_area / (run.capacity_milli * span), 4) if span > 0 else None,
        "cycles": run.cycles, "decisions": run.decisions,
        "migrations": run.moves,
        "migrations_per_hour": round(3600 * run.moves / span, 3) if span > 0 else None,
        "gpus_recovered_per_migration": round(run.recovered_milli / 1000 / run.moves, 3) if run.moves else None,
        "migration_lost_gpu_hours": round(run.move_lost_gpu_s / 3600, 1),
        **estimate_accuracy(run),
        **replay_figures(run),
    }
    if run.meter is not None:
        deviation, window, queue = run.meter.worst_deviation()
        summary.update({"quota_violations": sum(run.meter.violations.values()),
                        "fair_share_max_deviation_pct": round(100 * deviation, 2),
                        "fair_share_worst": {"window": window, "queue": queue},
                        "fair_share_windows": [
                            {"window": w, "queue": q, "gpu_hours": round(received / 3600 / MILLI, 2),
                             "fair_share_gpu_hours": round(fair / 3600 / MILLI, 2),
                             "deviation_pct": round(100 * (received - fair) / fair, 2)}
                            for w, q, received, fair in run.meter.window_deviations()]})
    if timing and run.cycle_seconds:
        cycle_ms = [1000 * s for s in run.cycle_seconds]
        summary.update({"cycle_p50_ms": round(nearest_rank(cycle_ms, 50), 3),
                        "cycle_p99_ms": round(nearest_rank(cycle_ms, 99), 3),
                        "decisions_per_s": round(run.decisions / sum(run.cycle_seconds)) if run.decisions else 0})
    return summary


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = SafeDictWriter(handle, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


QUEUE_COLUMNS = ("trace", "policy", "seed", "queue", "jobs", "gpu_hours", "fair_share_gpu_hours", "mean_wait_s",
                 "p99_wait_s", "preemptions", "quota_violations")


def queue_rows(trace: str, policy: str, seed: int, run: ReplayRun) -> list[dict[str, str]]:
    """One row per queue: jobs, GPU-unit hours received and fairly due, waits, preemptions, violations."""
    meter = run.meter
    if meter is None:
        return []
    rows = []
    for queue in sorted(meter.tree.specs):
        records = [r for r in run.records.values() if queue in meter.tree.paths.get(r.job.queue, ())]
        waits = [r.first_start - r.submit for r in records if r.first_start is not None]
        received = sum(w.received[queue] for w in meter.windows.values()) / MILLI / 3600
        fair = sum(w.fair[queue] for w in meter.windows.values()) / MILLI / 3600
        rows.append({"trace": trace, "policy": policy, "seed": str(seed), "queue": queue, "jobs": str(len(records)),
                     "gpu_hours": f"{received:.2f}", "fair_share_gpu_hours": f"{fair:.2f}",
                     "mean_wait_s": f"{statistics.fmean(waits):.1f}" if waits else "",
                     "p99_wait_s": f"{nearest_rank(waits, 99):.0f}" if waits else "",
                     "preemptions": str(sum(r.preemptions for r in records)),
                     "quota_violations": str(meter.violations.get(queue, 0))})
    return rows


def estimate_accuracy(run: ReplayRun) -> dict[str, object]:
    """JTTED over completed jobs that had an estimate: median actual/estimate and the share under-estimated."""
    ratios = [Fraction(round(r.end - r.start), max(1, round(r.job.runtime_estimate_s)))
              for r in run.records.values()
              if r.end is not None and r.start is not None and r.job.runtime_estimate_s]
    if not ratios:
        return {}
    return {"jtted_median": round(float(nearest_rank(ratios, 50)), 3),
            "jtted_under_pct": round(100 * sum(1 for x in ratios if x > 1) / len(ratios), 2),
            "jtted_buckets": histogram(ratios, ESTIMATE_BUCKETS)}


#: joins a policy's label and the job left out of its run (`fifo-without-job-000042`)
WITHOUT = "-without-"


def wait_regressions(rows: Sequence[dict[str, str]], baseline: str = "fifo") -> dict[str, dict[str, object]]:
    """Per (trace, policy, seed) run other than `baseline`: how many jobs waited longer than under `baseline`
    (same trace and seed) by more than their own runtime estimate, how many of them per queue, and the worst such
    excess in seconds. A job that started under the baseline but never under the other run counts as one.

    A run with a job left out (`policy-without-JOB`) is compared with `baseline-without-JOB`, and
    `baseline-without-JOB` with `baseline`: how far one job's absence moves the baseline itself."""
    runs: dict[tuple[str, str, str], dict[str, dict[str, str]]] = {}
    for row in rows:
        runs.setdefault((row["trace"], row["policy"], row["seed"]), {})[row["job"]] = row
    out: dict[str, dict[str, object]] = {}
    for (trace, policy, seed), jobs in sorted(runs.items()):
        name, without, job = policy.partition(WITHOUT)
        reference = baseline + without + job if name != baseline else baseline
        base = runs.get((trace, reference, seed))
        if policy == baseline or base is None:
            continue
        late: dict[str, int] = {}
        never, worst = 0, 0.0
        for job_id, row in jobs.items():
            ref = base.get(job_id)
            if ref is None or not ref["wait_s"]:
                continue
            if not row["wait_s"]:
                never += 1
                continue
            excess = float(row["wait_s"]) - float(ref["wait_s"]) - float(row["estimate_s"] or 0)
            if excess > 0:
                late[row["queue"]] = late.get(row["queue"], 0) + 1
                worst = max(worst, excess)
        out[f"{trace}/{policy}/{seed}"] = {"jobs": len(jobs),
                                           "waited_longer_than_fifo_plus_estimate": sum(late.values()),
                                           "late_by_queue": dict(sorted(late.items())),
                                           "started_under_fifo_only": never, "worst_excess_s": round(worst, 1)}
    return out
