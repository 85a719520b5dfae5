"""gpupool benchmarks (`make bench`): figures with the command that produced them, never timed tests.

Suites:
  fill   the FGD paper's 17 traces x 6 policies x seeds 42-51 on openb, compared with the published
         per-seed results shipped in ../shared/traces/fgd-artifact-results (the baseline, read in this run),
         and gpupool's `best` beside `fgd` on each trace
  speed  placement decisions per second of `fgd` and `best` at about 1k, 5k and 10k nodes (scaled copies of
         openb), against an uncached per-node evaluation measured in the same run
  cycle  scheduling-cycle latency (p50, p99) with 1,000 pending jobs in 4 queues on openb, per profile
  control-plane  submits/s and submit -> placed latency, 250 fake nodes x 8 GPUs, SQLite and PostgreSQL
  replay Philly's jobs over 10 weeks (VCs as queues) under fifo, default and fair-share, seeds 42-44, then
         `sim compare` (wait, JCT, bounded slowdown, useful GPU-hours with 95% intervals); --weeks shortens it
  k8s    gpupool and kube-scheduler side by side on one kube-apiserver: pods bound per second (1,000 nodes x 8 GPUs,
         5,000 whole-GPU pods) and GPU allocation of openb-shaped pods up to 130 % of capacity, with the simulator's
         `best` on the same pods and nodes (--k8s-nodes, --k8s-pods scale it down)
  usage  `GET /usage`, `gpupool usage` and the dashboard's usage pages over 30 days of ledger on 250 nodes
Run `python benchmarks/run.py --help` for options; `make bench BENCH_ARGS="--suite speed"` runs one suite.
`benchmarks/cycle_instructions.py` counts the cycle suite's instructions under valgrind (see its docstring).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import control_plane  # noqa: E402
import cycle_latency  # noqa: E402
import fill_fidelity  # noqa: E402
import kube_sched  # noqa: E402
import philly_replay  # noqa: E402
import placement_speed  # noqa: E402
import usage  # noqa: E402

FGD_TRACES = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
              "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "multigpu20", "multigpu30",
              "multigpu40", "multigpu50")


def shared() -> Path:
    return Path(os.environ.get("GPUPOOL_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["all", "fill", "speed", "cycle", "control-plane", "usage", "replay",
                                            "k8s"],
                        default="all")
    parser.add_argument("--traces", default=",".join(FGD_TRACES), help="comma-separated openb pod lists")
    parser.add_argument("--policies", default="random,dotprod,gpuclustering,gpupacking,bestfit,fgd,best")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--weeks", type=int, default=10, help="replay suite: weeks of Philly from 2017-10-02")
    parser.add_argument("--k8s-nodes", type=int, default=1000)
    parser.add_argument("--k8s-pods", type=int, default=5000)
    args = parser.parse_args()
    openb = shared() / "traces" / "alibaba-gpu-v2023"
    if not openb.is_dir():
        sys.exit(f"benchmarks need the shared openb trace at {openb} (set GPUPOOL_SHARED)")
    if args.suite in ("all", "speed"):
        placement_speed.run(openb, args.out / "speed")
    if args.suite in ("all", "control-plane"):
        control_plane.run()
    if args.suite in ("all", "k8s"):
        kube_sched.run(openb, args.k8s_nodes, args.k8s_pods)
    if args.suite in ("all", "usage"):
        usage.run()
    if args.suite in ("all", "cycle"):
        cycle_latency.run(openb, Path(__file__).resolve().parents[1] / "examples" / "openb-4-queues.yaml")
    if args.suite in ("all", "replay"):
        philly_replay.run(shared(), args.out / "replay", args.weeks, "42-44", args.jobs)
    if args.suite in ("all", "fill"):
        fill_fidelity.run(openb, shared() / "traces" / "fgd-artifact-results" / "analysis_allo_discrete.csv",
                          args.traces.split(","), args.policies.split(","), args.seeds, args.jobs, args.out / "fill")


if __name__ == "__main__":
    main()
