"""Fill-protocol outputs: results.csv rows, summary.json, plots and report.md.

"At X %" is the mean over all records whose arrived demand rounds to X % of capacity, or, when
there are none, over records within X +/- 1 (BENCHMARKS.md §2.2).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from gpupool.protocol.csvsafe import SafeDictWriter
from gpupool.sim.fill import FillRun, Record

FILL_COLUMNS = ("trace", "policy", "seed", "arrived_pct", "gpu_alloc_pct", "unallocated_gpus", "frag_pct",
                "frag_rate_pct", "decisions", "failed", "decisions_per_s")
SUMMARY_LEVELS = (100, 130)


def _rounded_pct(arrived: int, capacity: int) -> int:
    return (200 * arrived + capacity) // (2 * capacity)


def records_by_pct(run: FillRun) -> dict[int, list[tuple[int, Record]]]:
    """Record (with its 1-based position) grouped by arrived demand rounded to a whole percent."""
    groups: dict[int, list[tuple[int, Record]]] = defaultdict(list)
    for n, record in enumerate(run.records, start=1):
        groups[_rounded_pct(record.arrived_milli, run.capacity_milli)].append((n, record))
    return groups


def fill_rows(trace: str, policy: str, seed: int, run: FillRun, target_pct: int,
              timing: bool) -> list[dict[str, str]]:
    groups = records_by_pct(run)
    cap = run.capacity_milli
    rate = f"{run.decisions / run.seconds:.0f}" if timing and run.seconds > 0 else ""
    rows = []
    for pct in range(1, target_pct + 1):
        chosen = groups.get(pct) or groups.get(pct - 1, []) + groups.get(pct + 1, [])
        if not chosen:
            continue
        alloc = statistics.fmean(r.allocated_milli for _, r in chosen) / cap
        frag = statistics.fmean(r.frag_milli for _, r in chosen)
        idle = statistics.fmean(cap - r.allocated_milli for _, r in chosen)
        last_n, last = chosen[-1]
        rows.append({
            "trace": trace, "policy": policy, "seed": str(seed), "arrived_pct": str(pct),
            "gpu_alloc_pct": f"{100 * alloc:.2f}",
            "unallocated_gpus": f"{(1 - alloc) * cap / 1000:.1f}",
            "frag_pct": f"{100 * frag / cap:.2f}",
            "frag_rate_pct": f"{100 * frag / idle:.2f}" if idle else "0.00",
            "decisions": str(last_n), "failed": str(last.failed_so_far), "decisions_per_s": rate,
        })
    return rows


def write_results(out: Path, rows: Sequence[dict[str, str]]) -> Path:
    path = out / "results.csv"
    with path.open("w", newline="") as handle:
        writer = SafeDictWriter(handle, FILL_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def summarise(rows: Sequence[dict[str, str]], total_gpus: dict[str, int],
              bounds: dict[tuple[str, int], float] | None = None) -> dict[str, dict[str, dict[str, object]]]:
    """Per trace and policy, mean and sd over seeds at each SUMMARY_LEVEL, and ratios to the bounds.

    `bounds[(trace, level)]` is an allocation upper bound in percent (e.g. the LP bound); the capacity
    bound min(100, level) is always reported.
    """
    values: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for row in rows:
        level = int(row["arrived_pct"])
        if level in SUMMARY_LEVELS:
            values[(row["trace"], row["policy"], level)].append(float(row["gpu_alloc_pct"]))
    summary: dict[str, dict[str, dict[str, object]]] = defaultdict(dict)
    for (trace, policy, level), vals in sorted(values.items()):
        mean = statistics.fmean(vals)
        entry: dict[str, object] = {
            "seeds": len(vals), "mean": round(mean, 3), "per_seed": [round(v, 3) for v in vals],
            "sd": round(statistics.stdev(vals), 3) if len(vals) > 1 else 0.0,
            "unallocated_gpus": round((100 - mean) / 100 * total_gpus[trace], 1),
            "capacity_bound": min(100, level),
            "ratio_to_capacity_bound": round(mean / min(100, level), 4),
        }
        bound = (bounds or {}).get((trace, level))
        if bound is not None:
            entry["lp_bound"] = round(bound, 3)
            entry["ratio_to_lp_bound"] = round(mean / bound, 4) if bound else None
            entry["gap_gpus_to_lp_bound"] = round((bound - mean) / 100 * total_gpus[trace], 1)
        summary[trace].setdefault(policy, {})[f"at_{level}"] = entry
    return dict(summary)


def write_summary(out: Path, summary: dict[str, object]) -> Path:
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path
