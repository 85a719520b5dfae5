"""Fill protocol: tuning to the target demand, determinism, and `gpupool sim fill` end to end."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from gpupool.core import GpuDevice, NodeSpec, TaskShape, Workload, placement_profile
from gpupool.core.fragmentation import FragModel
from gpupool.sim.fill import run_fill, shuffled_names, tune
from gpupool.sim.synthetic import write_synthetic
from gpupool.sim.traces.openb import Pod


def _pods(*millis: int) -> list[Pod]:
    return [Pod(f"p{i}", TaskShape(gpu_count=1, gpu_milli=m)) for i, m in enumerate(millis)]


def test_tune_thins_a_list_above_the_target():
    order = tune(_pods(*[1000] * 10), 4000, Fraction(1), random.Random(1))
    assert sum(p.shape.total_gpu_milli for _, p in order) == 4000 and len(order) == 4


def test_tune_appends_draws_until_the_next_would_exceed_the_target():
    order = tune(_pods(500, 1000), 10_000, Fraction(13, 10), random.Random(3))
    total = sum(p.shape.total_gpu_milli for _, p in order)
    assert 12_000 <= total <= 13_000
    assert len({task_id for task_id, _ in order}) == len(order)  # appended copies get their own ids


def test_tune_is_a_function_of_the_seed():
    pods = _pods(*range(100, 1000, 37))
    assert tune(pods, 30_000, Fraction(13, 10), random.Random(5)) == tune(pods, 30_000, Fraction(13, 10),
                                                                          random.Random(5))


def test_shuffled_names_rank_the_nodes_by_a_seeded_permutation():
    nodes = [NodeSpec(n, 1000, 0) for n in ("c", "a", "b")]
    renamed = shuffled_names(nodes, random.Random(7))
    assert [n.name.split("-", 1)[1] for n in renamed] == ["a", "b", "c"]  # sorted by name, then renamed
    assert sorted(n.name.split("-", 1)[0] for n in renamed) == ["0000", "0001", "0002"]
    assert renamed == shuffled_names(nodes, random.Random(7))
    firsts = {min(shuffled_names(nodes, random.Random(s)), key=lambda n: n.name).name[5:] for s in range(20)}
    assert firsts == {"a", "b", "c"}  # any node can come first, not only the lowest trace name
    wide = shuffled_names([NodeSpec(f"n{i}", 1000, 0) for i in range(12_000)], random.Random(1))
    assert {len(n.name.split("-")[0]) for n in wide} == {5}  # zero-padded: name order is rank order


def _strand_cluster() -> tuple[list[NodeSpec], list[tuple[str, Pod]]]:
    """Two 1-GPU nodes with 1 core each and a CPU-only node; a 1-core CPU-only pod, then two 1-GPU pods of half a
    core. GpuPacking scores the CPU-only pod 0 everywhere, so it lands on the lowest name: on a GPU node it takes that
    node's last core and strands its GPU (50 % allocated), on the CPU-only node both GPU pods fit (100 %)."""
    gpu = (GpuDevice(0, "T4"),)
    nodes = [NodeSpec("a", 1000, 0, gpu), NodeSpec("b", 1000, 0, gpu), NodeSpec("c", 4000, 0)]
    cpu_pod = Pod("cpu", TaskShape(cpu_milli=1000))
    gpu_pods = [Pod(f"g{i}", TaskShape(cpu_milli=500, gpu_count=1, gpu_milli=1000)) for i in range(2)]
    return nodes, [(p.name, p) for p in (cpu_pod, *gpu_pods)]


def _allocated_pct(nodes: list[NodeSpec], order: list[tuple[str, Pod]]) -> int:
    workload = Workload.from_shapes(p.shape for _, p in order)
    run = run_fill(nodes, order, placement_profile("gpupacking").with_workload(workload), 1, FragModel(workload))
    return 100 * run.records[-1].allocated_milli // run.capacity_milli


def test_name_order_decides_where_ties_strand_gpus():
    nodes, order = _strand_cluster()
    assert _allocated_pct(nodes, order) == 50  # the trace's names: "a" first, always
    outcomes = set()
    for seed in range(12):
        renamed = shuffled_names(nodes, random.Random(seed))
        first = min(renamed, key=lambda n: n.name).name[5:]
        expected = 100 if first == "c" else 50
        assert _allocated_pct(renamed, order) == expected, seed
        outcomes.add(expected)
    assert outcomes == {50, 100}


def _fill(tmp: Path, nodes: Path, pods: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "sim", "fill", "--nodes", str(nodes), "--pods", str(pods),
           "--policy", "fgd,bestfit,random", "--seeds", "42-43", "--out", str(tmp / out), "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_fill_end_to_end_is_deterministic(tmp_path):
    nodes, pods = write_synthetic(tmp_path / "trace", nodes=24, pods=300)
    first = _fill(tmp_path, nodes, pods, "a", "--no-timing", "--jobs", "2")
    assert first.returncode == 0, first.stderr
    second = _fill(tmp_path, nodes, pods, "b", "--no-timing", "--jobs", "1")
    assert second.returncode == 0, second.stderr
    a, b = (tmp_path / "a" / "results.csv").read_bytes(), (tmp_path / "b" / "results.csv").read_bytes()
    assert a == b
    rows = list(csv.DictReader((tmp_path / "a" / "results.csv").open()))
    assert {r["policy"] for r in rows} == {"fgd", "bestfit", "random"}
    assert {int(r["arrived_pct"]) for r in rows} >= set(range(5, 126))
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["node_order"] == "shuffled"  # the paper's protocol unless --node-order name
    fgd = summary["traces"]["pods"]["fgd"]["at_100"]
    assert fgd["seeds"] == 2 and 0 < fgd["mean"] <= 100
    for name in ("report.md", "alloc_pods.png", "frag_pods.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0


def test_fill_on_a_slice_of_openb(tmp_path, openb):
    node_lines = (openb / "openb_node_list_gpu_node.csv").read_text().splitlines()
    pod_lines = (openb / "openb_pod_list_default.csv").read_text().splitlines()
    (tmp_path / "nodes.csv").write_text("\n".join(node_lines[:1] + node_lines[1::10]) + "\n")
    (tmp_path / "pods.csv").write_text("\n".join(pod_lines[:1] + pod_lines[1::10]) + "\n")
    result = _fill(tmp_path, tmp_path / "nodes.csv", tmp_path / "pods.csv", "out")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["traces"]["pods"]
    # FGD leaves fewer GPUs unallocated than Random even on a tenth of the cluster
    assert summary["fgd"]["at_130"]["mean"] > summary["random"]["at_130"]["mean"]
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    assert all(float(r["decisions_per_s"]) > 0 for r in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--policy", "nope"], "--policy"), (["--seeds", "9-1"], "--seeds"), (["--demand", "0"], "--demand"),
     (["--node-order", "alphabetical"], "--node-order")],
    ids=["unknown policy", "backwards seed range", "zero demand", "unknown node order"],
)
def test_bad_arguments_name_the_option(tmp_path, args, message):
    nodes, pods = write_synthetic(tmp_path / "trace", nodes=4, pods=10)
    result = _fill(tmp_path, nodes, pods, "out", *args)
    assert result.returncode == 2 and message in result.stderr


def test_malformed_trace_exits_with_file_and_line(tmp_path):
    nodes, pods = write_synthetic(tmp_path / "trace", nodes=4, pods=10)
    with pods.open("a") as handle:
        handle.write("bad-pod,1000,1024,one,1000\n")
    result = _fill(tmp_path, nodes, pods, "out", "--jobs", "1")
    # on one line however long the path: errors are never wrapped
    assert result.returncode == 2 and f"{pods}:12: column 'num_gpu'" in result.stdout
