"""Multi-tenant replays: EASY backfill keeps the head's reservation (ALGORITHMS.md §3 test 1), a starving
gang gets its reservation (§6 test 5), queue files are validated, and the replay reports per queue."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from gpupool.core import QueueSpec, QueueTree, scheduling_profile
from gpupool.core.testing.builders import gpu_units, make_job, make_node, make_shape
from gpupool.sim.replay import JobArrival, Replay
from gpupool.sim.replay_report import job_rows, wait_regressions
from gpupool.sim.tenants import assign_by_hash, load_queues
from gpupool.sim.traces.errors import TraceError

TWO = make_shape(1000, gpu_count=2)


def _job(name, tasks, at, runtime, priority=0):
    return JobArrival(at, make_job(name, *[TWO] * tasks, submitted_at=at, runtime_estimate_s=runtime,
                                   priority=priority), runtime)


def _easy_cluster(backfill):
    nodes = [make_node(f"n{i}", gpus=2) for i in range(1, 6)]
    arrivals = [_job("r1", 3, 0, 10), _job("j1", 4, 0.1, 5), _job("j2", 2, 0.2, 3), _job("j3", 2, 0.3, 12),
                _job("j4", 1, 0.4, 20)]
    tree = QueueTree([QueueSpec("default")])
    profile = scheduling_profile("fifo", "bestfit").with_args("allocate", backfill=backfill)
    return Replay(nodes, arrivals, profile, seed=1, queues=tree).run().records


def test_easy_backfill_reproduces_the_hand_computed_timeline():
    starts = {name: r.first_start for name, r in _easy_cluster("easy").items()}
    # J1 (8 GPUs) reserves the start R1 frees at t=10; J2 ends before that and backfills at once;
    # J4 backfills when J2 ends (t=3.2) on the node no reservation needs; J3 starts when J1 ends at 15.
    assert starts == {"r1": 0, "j1": 10, "j2": pytest.approx(0.2), "j3": 15, "j4": pytest.approx(3.2)}


def test_without_reservations_small_jobs_can_delay_the_big_one():
    starts = {name: r.first_start for name, r in _easy_cluster("none").items()}
    assert starts["j1"] > 10


def test_a_starving_gang_gets_a_reservation_after_waiting():
    nodes = [make_node("n", gpus=8)]
    big = JobArrival(60, make_job("big", make_shape(1000, gpu_count=8), submitted_at=60, runtime_estimate_s=600), 600)
    small = [JobArrival(300 * k, make_job(f"s{k}", make_shape(1000), submitted_at=300 * k, runtime_estimate_s=1800),
                        1800) for k in range(60)]
    tree = QueueTree([QueueSpec("default")])
    plain = scheduling_profile("fifo", "bestfit")
    guarded = plain.with_args("allocate", reserve_after_s=3600.0)
    never = Replay(nodes, [big, *small], plain, seed=1, queues=tree).run().records["big"].first_start
    assert never is None or never > 60 + 3600 + 1800
    start = Replay(nodes, [big, *small], guarded, seed=1, queues=tree).run().records["big"].first_start
    assert start is not None and start <= 60 + 3600 + 1800


def test_queue_file_errors_name_the_line_and_field(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("queues:\n  - name: a\n    guaranteed: {gpus: 2}\n  - name: b\n    guaranteed: {gpus: lots}\n")
    with pytest.raises(TraceError, match=r"q.yaml:4: column 'guaranteed.gpus'"):
        load_queues(path)
    path.write_text("queues:\n  - name: a\n    colour: red\n")
    with pytest.raises(TraceError, match=r"q.yaml:2: column 'colour'"):
        load_queues(path)


def test_example_queue_file_loads(tmp_path):
    from pathlib import Path
    tree = load_queues(Path(__file__).resolve().parents[2] / "examples" / "openb-4-queues.yaml")
    assert tree.leaves == ["batch", "inference", "nlp", "vision"]


def test_hash_assignment_is_stable_and_spreads():
    leaves = ["a", "b", "c", "d"]
    picks = [assign_by_hash(f"pod-{i}", leaves) for i in range(400)]
    assert picks == [assign_by_hash(f"pod-{i}", leaves) for i in range(400)]
    assert all(60 < picks.count(leaf) < 140 for leaf in leaves)


def _two_queues_on_a100s(tmp_path, node_count, guaranteed_gpus):
    """A node list of `node_count` 4-GPU A100 nodes and a queue file of queues a and b, each guaranteed that many."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     + "".join(f"n{i},64000,262144,4,A100\n" for i in range(node_count)))
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n" + "".join(f"  - name: {q}\n    guaranteed: {{gpus: {guaranteed_gpus}}}\n"
                                            for q in "ab"))
    return nodes, queues


def test_generate_then_replay_with_queues_end_to_end(tmp_path):
    nodes, queues = _two_queues_on_a100s(tmp_path, 8, 16)
    source = tmp_path / "src.csv"
    source.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                      "deletion_time,scheduled_time\n" + "".join(
                          f"p{i},4000,8192,{1 + i % 2},1000,,BE,Succeeded,0,{600 + 60 * i},0\n" for i in range(20)))
    base = [sys.executable, "-m", "gpupool.cli.main", "sim"]
    gen = subprocess.run([*base, "generate", "--nodes", str(nodes), "--queues", str(queues), "--source", str(source),
                          "--out", str(tmp_path / "wl.csv"), "--load", "1.2", "--days", "0.1", "--shares", "a=3,b=1"],
                         capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    run = subprocess.run([*base, "replay", "--nodes", str(nodes), "--pods", str(tmp_path / "wl.csv"), "--queues",
                          str(queues), "--assign", "column", "--profile", "fifo,default", "--out",
                          str(tmp_path / "out"), "--quiet", "--jobs", "1", "--tick-s", "5"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "queues.csv").open()))
    assert {r["queue"] for r in rows} == {"a", "b"} and {r["policy"] for r in rows} == {"fifo", "default"}
    assert all(r["quota_violations"] == "0" for r in rows)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["traces"]["wl"]["default"]["quota_violations"] == 0


def test_profile_without_queues_is_refused(tmp_path):
    run = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", "x", "--pods", "y",
                          "--profile", "default"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2


def test_wait_regressions_count_jobs_later_than_fifo_by_more_than_their_estimate():
    from gpupool.sim.replay_report import wait_regressions

    def row(policy, job, wait, estimate="100", queue="q1"):
        return {"trace": "t", "policy": policy, "seed": "1", "job": job, "wait_s": wait, "estimate_s": estimate,
                "queue": queue}

    rows = [row("fifo", "a", "10"), row("fifo", "b", "10"), row("fifo", "c", "10"), row("fifo", "d", ""),
            row("fifo", "e", "0", queue="q2"),
            row("default", "a", "110"),  # exactly fifo + estimate: allowed
            row("default", "b", "150"),  # 40 s beyond
            row("default", "c", ""),  # started under fifo only
            row("default", "d", "5000"),  # never started under fifo: not comparable
            row("default", "e", "130", queue="q2")]  # 30 s beyond
    assert wait_regressions(rows) == {"t/default/1": {"jobs": 5, "waited_longer_than_fifo_plus_estimate": 2,
                                                      "late_by_queue": {"q1": 1, "q2": 1},
                                                      "started_under_fifo_only": 1, "worst_excess_s": 40.0}}


def test_wait_regressions_compare_a_run_with_a_job_left_out_against_fifo_without_it():
    from gpupool.sim.replay_report import wait_regressions

    def row(policy, job, wait):
        return {"trace": "t", "policy": policy, "seed": "1", "job": job, "wait_s": wait, "estimate_s": "10",
                "queue": "q"}

    rows = [row("fifo", "a", "0"), row("fifo", "b", "0"),
            row("fifo-without-c", "a", "50"), row("fifo-without-c", "b", "0"),  # a: 40 s beyond fifo
            row("default-without-c", "a", "50"), row("default-without-c", "b", "30")]  # b: 20 s beyond fifo-without-c
    out = wait_regressions(rows)
    assert out["t/fifo-without-c/1"]["waited_longer_than_fifo_plus_estimate"] == 1
    assert out["t/fifo-without-c/1"]["worst_excess_s"] == 40.0
    assert out["t/default-without-c/1"]["waited_longer_than_fifo_plus_estimate"] == 1
    assert out["t/default-without-c/1"]["worst_excess_s"] == 20.0


def _overloaded_pair(hours: int) -> list[dict[str, str]]:
    """Job rows of `fifo` and `default` on 4 GPUs, where every 100 s queue a sends four 100 s jobs and queue b two
    (both guaranteed 2 GPUs) for `hours`: load 1.5, and a asks twice its fair share."""
    nodes = [make_node("n1", gpus=2), make_node("n2", gpus=2)]
    tree = QueueTree([QueueSpec("a", guaranteed=gpu_units(2)), QueueSpec("b", guaranteed=gpu_units(2))])
    arrivals = [JobArrival(100.0 * k, make_job(f"{q}{k:03d}-{m}", make_shape(1000), queue=q, submitted_at=100.0 * k,
                                               runtime_estimate_s=100.0), 100.0)
                for k in range(36 * hours) for q, n in (("a", 4), ("b", 2)) for m in range(n)]
    rows = []
    for profile in ("fifo", "default"):
        run = Replay(nodes, arrivals, scheduling_profile(profile, "bestfit"), seed=1, queues=tree).run()
        rows += job_rows("pair", profile, 1, run)
    return rows


def test_fair_share_makes_an_over_share_queue_later_than_fifo_by_more_than_any_estimate():
    """Why no fair-share order can keep every job within its estimate of `fifo` (README, issue 4): under overload
    `fifo` serves a queue by its arrivals, fair share by its share, so an over-share queue falls behind its `fifo`
    self by an amount that grows with the overload, not with any job's estimate."""
    worst = {}
    for hours in (1, 3):
        rows = _overloaded_pair(hours)
        mean = {(r["policy"], r["queue"]): 0.0 for r in rows}
        for r in rows:
            mean[(r["policy"], r["queue"])] += float(r["wait_s"]) / (36 * hours * (4 if r["queue"] == "a" else 2))
        assert mean[("default", "b")] < mean[("fifo", "b")] and mean[("default", "a")] > mean[("fifo", "a")]
        late = wait_regressions(rows)["pair/default/1"]
        assert late["late_by_queue"].get("b", 0) == 0 and late["late_by_queue"]["a"] > 2 * 36 * hours  # most of a's
        worst[hours] = late["worst_excess_s"]
    assert worst[1] > 5 * 100 and worst[3] >= 3 * worst[1]  # 800 s and 2,600 s: 900 s more per hour of overload


def _tiny_tenant_replay(tmp_path):
    """The command line of a replay of 12 jobs of two queues on two 4-GPU nodes, without --out."""
    nodes, queues = _two_queues_on_a100s(tmp_path, 2, 4)
    pods = tmp_path / "wl.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time,queue\n" + "".join(
                        f"p{i},4000,8192,{1 + i % 3},1000,,BE,Succeeded,{10 * i},{10 * i + 300 + 50 * i},{10 * i},"
                        f"{'ab'[i % 2]}\n" for i in range(12)))
    return [sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", str(nodes), "--pods", str(pods),
            "--queues", str(queues), "--assign", "column", "--profile", "fifo,default", "--quiet", "--jobs", "1"]


def test_leave_one_out_replays_each_profile_again_without_one_job(tmp_path):
    base = _tiny_tenant_replay(tmp_path)
    run = subprocess.run([*base, "--out", str(tmp_path / "out"), "--leave-one-out", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    jobs = list(csv.DictReader((tmp_path / "out" / "jobs.csv").open()))
    by_run: dict[str, set[str]] = {}
    for r in jobs:
        by_run.setdefault(r["policy"], set()).add(r["job"])
    perturbed = sorted(p for p in by_run if "-without-" in p)
    assert len(perturbed) == 4 and by_run["fifo"] == by_run["default"] == {f"p{i}" for i in range(12)}
    for label in perturbed:
        profile, _, left = label.partition("-without-")
        assert profile in ("fifo", "default") and by_run[label] == by_run["fifo"] - {left}
        assert f"{'fifo' if profile == 'default' else profile}-without-{left}" in by_run
    regressions = json.loads((tmp_path / "out" / "summary.json").read_text())["wait_regressions_vs_fifo"]
    assert sorted(regressions) == sorted(["wl/default/42", *(f"wl/{p}/42" for p in perturbed)])
    refused = subprocess.run([*base, "--out", str(tmp_path / "x"), "--leave-one-out", "13"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--leave-one-out" in refused.stderr and "12 jobs" in refused.stderr


def test_exact_estimates_give_every_job_its_true_duration(tmp_path):
    base = _tiny_tenant_replay(tmp_path)
    run = subprocess.run([*base, "--out", str(tmp_path / "out"), "--estimates", "exact"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    jobs = list(csv.DictReader((tmp_path / "out" / "jobs.csv").open()))
    assert len(jobs) == 24 and all(r["preemptions"] == "0" for r in jobs)
    assert all(float(r["estimate_s"]) == float(r["end_s"]) - float(r["start_s"]) for r in jobs)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["estimates"] == "exact"
    predicted = subprocess.run([*base, "--out", str(tmp_path / "p")], capture_output=True, text=True, timeout=300)
    assert predicted.returncode == 0, predicted.stderr
    rows = list(csv.DictReader((tmp_path / "p" / "jobs.csv").open()))
    assert any(not r["estimate_s"] or float(r["estimate_s"]) != float(r["end_s"]) - float(r["start_s"]) for r in rows)
    refused = subprocess.run([*base, "--out", str(tmp_path / "x"), "--estimates", "perfect"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--estimates" in refused.stderr
