"""The replay suite: Philly's jobs (../shared/traces/tenant-demand/philly_jobs.csv) over its recommended 10 weeks
(jobs submitted 2017-10-02 to 2017-12-11), the virtual clusters as queues (`--queues tenants`), on the documented
cluster `examples/philly-cluster.csv` (62 nodes of 8 GPUs, offered load about 0.9), under fifo, default and
fair-share over 3 seeds; then `gpupool sim compare` prints wait, JCT, bounded slowdown (p50, p99) and useful
GPU-hours per profile with 95% intervals over the seeds. The measurement window leaves out the first two days
(the cluster starts empty: jobs submitted before 2017-10-02 are not replayed). Cycles run at most once per simulated
minute (`--tick-s 60`); each seed delays every submission by a seeded draw of up to 5 minutes (`--jitter-s 300`),
so that the intervals over seeds show how much the figures move with the workload. Its wall time is reported with
the command, since a full run takes a long time.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = dt.date(2017, 10, 2)
WARMUP_S = 2 * 86_400
#: each seed delays every submission by up to 5 minutes, so the 3 seeds sample nearby workloads (a replay of the
#: trace as it is would give the same figures under every seed: zero-width intervals)
JITTER_S = 300


def command(shared: Path, out: Path, weeks: int, seeds: str, jobs: int) -> list[str]:
    until = START + dt.timedelta(weeks=weeks)
    return ["gpupool", "sim", "replay", "--nodes", str(ROOT / "examples" / "philly-cluster.csv"),
            "--pods", str(shared / "traces" / "tenant-demand" / "philly_jobs.csv"),
            "--submitted", f"{START.isoformat()},{until.isoformat()}", "--queues", "tenants",
            "--profile", "fifo,default,fair-share", "--seeds", seeds, "--tick-s", "60",
            "--warmup-s", str(WARMUP_S), "--jitter-s", str(JITTER_S), "--no-timing", "--out", str(out),
            "--jobs", str(jobs)]


def run(shared: Path, out: Path, weeks: int = 10, seeds: str = "42-44", jobs: int = 2) -> Path:
    """Replay, compare, and write `out/figures.md` (the command, its wall time, the compare table)."""
    argv = command(shared, out, weeks, seeds, jobs)
    cli = [sys.executable, "-m", "gpupool.cli.main"]
    began = time.monotonic()
    subprocess.run([*cli, *argv[1:]], check=True)
    wall = time.monotonic() - began
    compared = subprocess.run([*cli, "sim", "compare", str(out)], check=True, capture_output=True, text=True,
                              env={"COLUMNS": "140", "PATH": "/usr/bin:/bin"})
    report = out / "figures.md"
    report.write_text(f"# Philly replay, {weeks} weeks\n\nCommand ({wall / 60:.1f} min wall on this machine, "
                      f"{jobs} processes):\n\n```\n{' '.join(argv)}\n```\n\n```\n{compared.stdout}```\n")
    print(compared.stdout)
    print(f"replay suite: {wall / 60:.1f} min wall; figures in {report}")
    return report
