"""Time-based replay: arrivals wait in a queue that is retried as resources free up."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from gpupool.core import Workload, placement_profile
from gpupool.core.testing.builders import make_job, make_node, make_shape
from gpupool.sim.engine import Engine
from gpupool.sim.replay import JobArrival, Replay


def test_engine_orders_by_time_then_priority_then_sequence():
    engine, seen = Engine(), []
    for at, prio, name in [(5, 1, "late"), (1, 2, "b"), (1, 1, "a"), (1, 2, "c")]:
        engine.schedule(at, prio, seen.append, name)
    engine.run()
    assert seen == ["a", "b", "c", "late"] and engine.now == 5
    with pytest.raises(ValueError):
        engine.schedule(1, 0, seen.append)


def test_queued_job_starts_when_the_gpu_frees_up():
    arrivals = [JobArrival(0, make_job("a", make_shape(1000), submitted_at=0), 10),
                JobArrival(1, make_job("b", make_shape(1000), submitted_at=1), 5),
                JobArrival(2, make_job("c", make_shape(500), submitted_at=2), 3)]
    run = Replay([make_node("n", gpus=1)], arrivals, placement_profile("bestfit"), seed=1).run()
    records = run.records
    assert (records["a"].first_start, records["a"].end) == (0, 10)
    # FIFO: b is older than c, so b gets the GPU at t=10 and c waits until b ends at 15
    assert (records["b"].first_start, records["b"].end) == (10, 15)
    assert (records["c"].first_start, records["c"].end) == (15, 18)
    assert run.allocated_area == pytest.approx(10 * 1000 + 5 * 1000 + 3 * 500)


def test_unplaceable_job_keeps_its_reason():
    arrivals = [JobArrival(0, make_job("big", make_shape(1000, gpu_count=4)), 10)]
    profile = placement_profile("fgd").with_args("fgd", workload=Workload.from_shapes([make_shape()]))
    run = Replay([make_node("n", gpus=2)], arrivals, profile, seed=1).run()
    assert run.records["big"].first_start is None
    assert "too few GPUs on node" in run.records["big"].last_reason.message


def test_replay_cli_writes_jobs_and_summary(tmp_path):
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,1,T4\n")
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\np0,1000,1024,1,1000,,LS,Succeeded,0,100,0\np1,1000,1024,1,1000,,LS,Succeeded,10,60,10\n")
    cmd = [sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", str(tmp_path / "nodes.csv"),
           "--pods", str(tmp_path / "pods.csv"), "--policy", "bestfit", "--out", str(tmp_path / "out"),
           "--quiet", "--jobs", "1", "--sample-s", "10"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    jobs = {r["job"]: r for r in csv.DictReader((tmp_path / "out" / "jobs.csv").open())}
    assert jobs["p1"]["wait_s"] == "90" and jobs["p1"]["end_s"] == "150"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["traces"]["pods"]["bestfit"]["mean_wait_s"] == 45.0
    samples = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert samples[0]["gpu_alloc_pct"] == "100.00"
    header, _, row = (line.strip("|").split(" | ") for line in
                      (tmp_path / "out" / "report.md").read_text().splitlines() if line.startswith("|"))
    report = dict(zip((h.strip() for h in header), (c.strip() for c in row), strict=True))
    means = summary["traces"]["pods"]["bestfit"]
    assert report["GAR over the window"] == str(means["gar_window"])  # each figure under its own name
    assert report["GAR over the run"] == str(means["gar_run"])


def test_replay_needs_time_columns(tmp_path):
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,32768,1,T4\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n")
    cmd = [sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", str(tmp_path / "nodes.csv"),
           "--pods", str(tmp_path / "pods.csv"), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "column 'creation_time'" in result.stdout.replace("\n", "")


@pytest.mark.parametrize(("checkpointable", "a_ends", "lost_gpu_hours"), [(True, 100, 0.0), (False, 101, 1 / 3600)],
                         ids=["checkpointable task resumes", "job that cannot checkpoint starts over"])
def test_consolidation_in_replay_starts_the_blocked_job_and_is_reported(checkpointable, a_ends, lost_gpu_hours):
    from gpupool.sim.replay_report import run_summary
    a = replace(make_job("a", make_shape(1000), submitted_at=0), checkpointable=checkpointable)
    arrivals = [JobArrival(0, a, 100), JobArrival(0, make_job("b", make_shape(1000), submitted_at=0), 100),
                JobArrival(1, make_job("c", make_shape(1000, gpu_count=2), submitted_at=1), 10)]
    nodes = [make_node("n1", gpus=2), make_node("n2", gpus=2)]
    spread = placement_profile("spread")
    plain = Replay(nodes, arrivals, spread, seed=1).run()
    assert plain.records["c"].first_start == 100
    moving = Replay(nodes, arrivals, spread.with_actions("allocate", "consolidate"), seed=1).run()
    assert moving.records["c"].first_start == 1
    assert moving.records["b"].end == 100 and moving.records["a"].end == a_ends  # a moved at t=1
    summary = run_summary(moving, timing=False)
    assert summary["migrations"] == 1 and summary["gpus_recovered_per_migration"] == 2.0
    assert summary["migration_lost_gpu_hours"] == round(lost_gpu_hours, 1)
    assert moving.move_lost_gpu_s == pytest.approx(3600 * lost_gpu_hours)


@pytest.mark.parametrize(("profile", "actions"), [
    ("fair-share", ("allocate", "consolidate", "reclaim", "preempt")),
    (None, ("allocate", "consolidate")),
], ids=["moves go before evictions", "placement policy only"])
def test_consolidate_option_runs_right_after_allocate(profile, actions):
    from gpupool.sim.experiment import ReplayTask, _replay_profile
    task = ReplayTask("nodes.csv", "pods.csv", "bestfit", 1, 0.0, 3600.0, False, (3, 20), profile)
    built = _replay_profile(task, [], [])
    assert built.actions == actions and built.args["consolidate"] == {"max_moves_per_cycle": 3,
                                                                      "max_moves_per_hour": 20}
