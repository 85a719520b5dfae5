"""Agents on loopback: agent start -> node schedulable, and submit -> workload process started (p50, p99).

A control plane on SQLite with the default timings (RELIABILITY.md §2.2: heartbeat 5 s) and AGENTS real agent
processes (`python -m gpupool.cli.main agent ... --fake-gpus 2xA100-80GB`) on this machine. Targets: start ->
schedulable p99 < 5 s, submit -> started p99 < 2 s.

* start -> schedulable: from just before the agent process is spawned until GET /nodes shows the node "ready"
  (registered; the scheduler's cache marks it schedulable in the same request), polled every 20 ms. Agents are
  started one at a time (the next once the previous is ready, at least SPACING_S apart), so each start is measured
  with the earlier agents running (a burst of 50 Python starts on 2 cores would measure the CPU queue, not gpupool).
  The Python start-up of the CLI is measured alone too, as the floor of this figure.
* submit -> started: JOBS one-GPU jobs submitted open-loop, one every SUBMIT_GAP_S; each job's first log line is
  `date +%s.%N` printed by the workload process itself, compared with the client's clock just before the POST (one
  host clock). Also reported: the allocation's started_at (when the control plane got the agent's "started"
  report) minus the job's submitted_at, both stamped by the control plane.

Run: `.venv/bin/python benchmarks/agents.py [--agents 50] [--out bench-out/agents]`; `run(out_dir)` from Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from agent_cluster import AGENT, Cluster, wait_for  # noqa: E402

from gpupool.core.metrics import nearest_rank  # noqa: E402

AGENTS, SPACING_S, JOBS, SUBMIT_GAP_S, JOB_S = 50, 0.5, 100, 0.1, 2


def _stamp(value: str) -> float:
    at = datetime.fromisoformat(value)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _pct(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": nearest_rank(values, 50), "p99_s": nearest_rank(values, 99),
            "max_s": max(values)}


def _cli_startup_s(runs: int = 5) -> float:
    """Median wall time of `python -c 'import gpupool.cli.main'`: what every agent start pays before any work."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import gpupool.cli.main"], check=True)
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]


def _start_agents(cluster: Cluster, count: int) -> list[float]:
    latencies = []
    for n in range(count):
        name = f"bench-{n:03d}"
        agent = cluster.start_agent(name)
        wait_for(lambda name=name: cluster.nodes().get(name, {}).get("state") == "ready", 60,
                 f"agent {name} to be ready", step_s=0.02)
        latencies.append(time.time() - agent.spawned_at)
        time.sleep(max(0.0, SPACING_S - latencies[-1]))
    return latencies


def _run_jobs(cluster: Cluster, count: int) -> tuple[list[float], list[float]]:
    submitted: dict[str, float] = {}
    for _ in range(count):
        before = time.time()
        job_id = cluster.submit(command=["sh", "-c", f"date +%s.%N; sleep {JOB_S}"], gpus="1")
        submitted[job_id] = before
        time.sleep(SUBMIT_GAP_S)
    process, server = [], []
    for job_id, before in submitted.items():
        job = cluster.wait_job(job_id, timeout_s=120)
        assert job["state"] == "succeeded", job
        first = cluster.logs(job_id).split("\n", 1)[0]
        process.append(float(first) - before)
        server.append(_stamp(job["allocations"][0]["started_at"]) - _stamp(job["submitted_at"]))
    return process, server


def run(out_dir: Path, agents: int = AGENTS, jobs: int = JOBS) -> dict[str, Any]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"command: {sys.executable} benchmarks/agents.py --agents {agents} --jobs {jobs} --out {out_dir}")
    print(f"agents: control plane (SQLite, default timings) + {agents} agent processes x 2 fake A100, "
          f"{os.cpu_count()} CPUs; each agent: python {' '.join(AGENT[1:])} --server URL --join-token T "
          "--data-dir D --name N --fake-gpus 2xA100-80GB")
    startup = _cli_startup_s()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-agents-") as tmp, Cluster(Path(tmp), env={}) as cluster:
        began = time.monotonic()
        start = _start_agents(cluster, agents)
        print(f"agents: {agents} started one at a time in {time.monotonic() - began:.1f} s")
        process, server = _run_jobs(cluster, jobs)
        alive = sum(agent.alive for agent in cluster.agents.values())
    results: dict[str, Any] = {
        "agents": agents, "jobs": jobs, "cpus": os.cpu_count(), "cli_import_s": startup, "agents_alive_at_end": alive,
        "start_to_schedulable": _pct(start), "submit_to_process_started": _pct(process),
        "submitted_to_started_at_server": _pct(server),
    }
    (out_dir / "agents.json").write_text(json.dumps(results, indent=2))
    for label, key, target in (("agent start -> node schedulable", "start_to_schedulable", 5.0),
                               ("submit -> process started", "submit_to_process_started", 2.0),
                               ("submitted_at -> started_at (control plane)", "submitted_to_started_at_server", 2.0)):
        r = results[key]
        verdict = "meets" if r["p99_s"] < target else "MISSES"
        print(f"agents: {label}: p50 {r['p50_s']:.3f} s, p99 {r['p99_s']:.3f} s, max {r['max_s']:.3f} s "
              f"over {r['n']} ({verdict} the p99 < {target:g} s target)")
    print(f"agents: floor: `python -c 'import gpupool.cli.main'` takes {startup:.2f} s here (median of 5); "
          f"{alive}/{agents} agents still alive at the end")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=AGENTS)
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--out", type=Path, default=Path("bench-out/agents"))
    args = parser.parse_args()
    run(args.out, args.agents, args.jobs)


if __name__ == "__main__":
    main()
