"""Metrics that separate policies (issue 44, item 2): wait, JCT and bounded slowdown by their definitions, over the
measurement window and the whole run, per queue; GAR over the window; useful against redone work; long waits
visible however rare; confidence intervals over seeds in `sim compare`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from gpupool.core import QueueSpec, QueueTree, ResourceVector, placement_profile, scheduling_profile
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_job, make_node, make_shape
from gpupool.sim.compare import interval, replay_intervals
from gpupool.sim.replay import JobArrival, Replay
from gpupool.sim.replay_metrics import SLOWDOWN_BOUND_S, replay_figures, stats

ONE = make_shape(1000)


def _arrival(name, at, runtime, queue="default"):
    return JobArrival(at, make_job(name, ONE, submitted_at=at, queue=queue), runtime)


def test_wait_jct_and_bounded_slowdown_follow_their_definitions():
    # one GPU: a runs [0, 100), b (2 s long) waits until 100, c until 102
    arrivals = [_arrival("a", 0, 100), _arrival("b", 1, 2), _arrival("c", 50, 30)]
    run = Replay([make_node("n", gpus=1)], arrivals, placement_profile("bestfit"), seed=1, window=(0, 60)).run()
    figures = replay_figures(run)
    whole = figures["whole"]
    assert whole["wait_s"] == {"mean": round((0 + 99 + 52) / 3, 1), "p50": 52.0, "p95": 99.0, "p99": 99.0,
                               "max": 99.0}
    assert whole["jct_s"]["max"] == 101.0 and whole["jct_s"]["p50"] == 100.0
    # b: JCT 101 over max(2, 10) = 10.1; c: 82 / 30; a: 1
    assert whole["bounded_slowdown"]["max"] == round(101 / SLOWDOWN_BOUND_S, 1)
    assert whole["bounded_slowdown"]["p50"] == round(82 / 30, 1)
    assert figures["gar_window"] == 1.0 and figures["makespan_s"] == 132.0
    assert figures["useful_gpu_hours"] == round(132 / 3600, 2) and figures["redone_gpu_hours"] == 0.0


def test_the_window_leaves_out_warm_up_and_cool_down():
    arrivals = [_arrival("early", 0, 10), _arrival("mid", 100, 50), _arrival("late", 1000, 10)]
    run = Replay([make_node("n", gpus=2)], arrivals, placement_profile("bestfit"), seed=1, window=(50, 200)).run()
    figures = replay_figures(run)
    assert figures["window"]["jobs"] == 1 and figures["whole"]["jobs"] == 3
    assert figures["gar_window"] == pytest.approx(50 * 1000 / (2000 * 150), abs=1e-4)
    assert figures["window_s"] == [50.0, 200.0]


def test_rare_long_waits_show_in_max_and_in_p99_once_they_are_one_percent():
    """Issue 44: two jobs that waited 22 h and 31 h showed only in the mean (`p99_wait_s: 0.0`)."""
    for short_jobs, p99_long in ((298, False), (98, True)):
        wide = make_shape(1000, gpu_count=8)
        # the 8-GPU node is held for 22 h, so both 8-GPU jobs wait that long; 1-GPU jobs never wait
        arrivals = [JobArrival(at, make_job(name, wide, submitted_at=at), runtime)
                    for name, at, runtime in (("hog", 0, 22 * 3600), ("long-1", 1, 60), ("long-2", 2, 60))]
        arrivals += [_arrival(f"s{i}", 10 + i, 1) for i in range(short_jobs)]
        nodes = [make_node("n8", gpus=8), make_node("n4", gpus=4)]
        run = Replay(nodes, arrivals, placement_profile("bestfit"), seed=1).run()
        waits = replay_figures(run)["whole"]["wait_s"]
        assert waits["max"] == 22 * 3600 + 60 - 2
        assert (waits["p99"] >= 22 * 3600 - 1) is p99_long and (waits["p99"] == 0) is not p99_long


def test_redone_work_counts_what_evicted_jobs_ran_before_they_started_over():
    tree = QueueTree([QueueSpec("a", guaranteed=ResourceVector({GPU_UNITS: 1000})),
                      QueueSpec("b", guaranteed=ResourceVector({GPU_UNITS: 1000}))])
    arrivals = [_arrival("a1", 0, 1000, "a"), _arrival("a2", 0, 1000, "a"), _arrival("b1", 100, 10, "b")]
    run = Replay([make_node("n", gpus=2)], arrivals, scheduling_profile("fair-share", "bestfit"), seed=1,
                 queues=tree).run()
    figures = replay_figures(run)
    assert sum(r.preemptions for r in run.records.values()) == 1
    assert figures["redone_gpu_hours"] == round(100 / 3600, 2)
    assert figures["useful_gpu_hours"] == round(2010 / 3600, 2)
    assert set(figures["per_queue"]) == {"a", "b"} and figures["per_queue"]["b"]["whole"]["jobs"] == 1


def test_intervals_are_student_t_over_seeds():
    ci = interval([1.0, 2.0, 3.0])
    assert (ci.mean, round(ci.lo, 3), round(ci.hi, 3), ci.seeds) == (2.0, -0.484, 4.484, 3)
    assert interval([5.0]).text() == "5" and stats([]) == dict.fromkeys(("mean", "p50", "p95", "p99", "max"))
    runs = [{"trace": "t", "policy": "p", "seed": s, "gar_window": g} for s, g in ((1, 0.5), (2, 0.7))]
    assert replay_intervals(runs)["t"]["GAR over the window"]["p"].mean == pytest.approx(0.6)


def test_compare_prints_intervals_and_warns_with_one_seed(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,A100\n")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,tenant,submit_time,duration_s,gpus\n" + "".join(
        f"j{i},{'xy'[i % 2]},{5 * i},{40 + 7 * i},1\n" for i in range(10)))
    base = [sys.executable, "-m", "gpupool.cli.main", "sim"]
    env = {**os.environ, "COLUMNS": "160"}
    for seeds, out in (("1", "one"), ("1-3", "three")):
        run = subprocess.run([*base, "replay", "--nodes", str(nodes), "--pods", str(jobs), "--policy", "bestfit,random",
                              "--queues", "tenants", "--profile", "fifo",
                              "--seeds", seeds, "--out", str(tmp_path / out), "--quiet", "--jobs", "1"],
                             capture_output=True, text=True, timeout=300, env=env)
        assert run.returncode == 0, run.stderr
    one = subprocess.run([*base, "compare", str(tmp_path / "one")], capture_output=True, text=True, env=env)
    three = subprocess.run([*base, "compare", str(tmp_path / "three")], capture_output=True, text=True, env=env)
    assert "warning: one seed" in one.stdout and "warning" not in three.stdout
    for text in ("bounded slowdown p99", "JCT p50 (s)", "GAR over the window", "useful GPU-hours", "bestfit"):
        assert text in three.stdout
    assert "[" in three.stdout and "±" not in three.stdout
    queues = subprocess.run([*base, "compare", str(tmp_path / "three"), "--per-queue"], capture_output=True,
                            text=True, env=env)
    assert "queue x" in queues.stdout and "queue y" in queues.stdout
    summary = json.loads((tmp_path / "three" / "summary.json").read_text())
    assert {r["seed"] for r in summary["runs"]} == {1, 2, 3}


def test_reruns_are_byte_identical_apart_from_the_declared_timestamp_and_record_provenance(tmp_path):
    """Issue 44, item 5: summary.json holds version, commit, input hashes, the resolved configuration, seeds and
    library versions; the same command run twice writes the same bytes but for `provenance.created_utc`."""
    import hashlib

    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,4,A100\nn1,64000,262144,8,A100\n")
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("job_id,tenant,submit_time,duration_s,gpus\n" + "".join(
        f"j{i},{'xyz'[i % 3]},{7 * i},{50 + 13 * (i % 9) * i},{[1, 2, 0.5, 4][i % 4]}\n" for i in range(40)))
    command = [sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", str(nodes), "--pods", str(jobs),
               "--queues", "tenants", "--profile", "fifo,default", "--policy", "fgd", "--seeds", "1-2", "--out",
               str(tmp_path / "out"), "--jobs", "2", "--quiet", "--no-timing", "--sample-s", "60"]
    outputs = []
    for _ in range(2):
        run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        files = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
        summary = json.loads(files.pop("summary.json"))
        stamp = summary["provenance"].pop("created_utc")
        assert summary["provenance"]["timestamps"] == ["provenance.created_utc"] and stamp.endswith("Z")
        outputs.append((files, summary))
    assert outputs[0] == outputs[1] and {"results.csv", "jobs.csv", "alloc_jobs.png"} <= set(outputs[0][0])
    provenance = outputs[0][1]["provenance"]
    assert provenance["inputs"][str(jobs)]["sha256"] == hashlib.sha256(jobs.read_bytes()).hexdigest()
    assert provenance["gpupool_version"] and len(provenance["commit"] or "x" * 40) == 40
    assert provenance["seeds"] == [1, 2] and provenance["libraries"]["numpy"] and provenance["python"]
    assert provenance["config"]["profiles"]["default"]["queue_order"] == "fair_share"
    assert provenance["config"]["options"]["queues"] == "tenants"


def test_jitter_delays_each_submission_by_a_seeded_draw_below_the_bound():
    from gpupool.sim.experiment import jittered

    arrivals = [_arrival(f"j{i}", 10.0 * i, 5) for i in range(50)]
    once, again, other = (jittered(arrivals, seed, 300) for seed in (1, 1, 2))
    assert once == again and once != other and jittered(arrivals, 1, 0) is arrivals
    delays = [b.time - a.time for a, b in zip(arrivals, once, strict=True)]
    assert all(0 <= d < 300 for d in delays) and max(delays) > 150
    assert all(b.job.submitted_at == b.time for b in once)


def test_runs_of_several_policies_under_one_profile_keep_apart():
    """`--profile fifo --policy bestfit,fgd` ran both policies under the one label `fifo`, merging their figures."""
    from gpupool.sim.experiment import ReplayTask

    task = ReplayTask("n.csv", "p.csv", "fgd", 1, 0.0, 3600.0, False, profile="fifo")
    assert task.label == "fifo" and replace(task, with_policy=True).label == "fifo@fgd"
    assert replace(task, profile=None).label == "fgd"
