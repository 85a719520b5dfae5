"""Honest generation (issue 44, item 4): `sim generate --load` is the load inside the measurement window, its
`next:` command replays exactly what it generated, and guarantees above the simulated cluster are refused or scaled
by an explicit option."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.core import QueueSpec, QueueTree, ResourceVector
from gpupool.core.queues import GPU_UNITS
from gpupool.core.testing.builders import make_node
from gpupool.sim.generate import WorkloadSpec, generate
from gpupool.sim.tenants import fit_guarantees
from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.jobtable import read_jobs

OPENB = Path(os.environ.get("GPUPOOL_SHARED", "/work/shared")) / "traces" / "alibaba-gpu-v2023"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLI = [sys.executable, "-m", "gpupool.cli.main", "sim"]


def test_offered_load_inside_the_window_meets_the_target(tmp_path):
    jobs = tmp_path / "src.csv"
    jobs.write_text("job_id,submit_time,duration_s,gpus\n" + "".join(
        f"j{i},{i},{60 * (1 + i % 50) ** 2},{1 + i % 4}\n" for i in range(200)))  # up to 41 h: far past the window
    spec = WorkloadSpec(load=0.9, days=0.1, gang_share=0.0, seed=3)
    made = generate(read_jobs(jobs), 40, {"a": 1.0}, spec, tmp_path / "wl.csv")
    assert made.window_s == 8640 and made.warmup_s == made.max_duration_s == 2160
    assert made.offered_load == pytest.approx(0.9, abs=0.01)
    rows = (tmp_path / "wl.csv").read_text().splitlines()[1:]
    ends = [int(r.split(",")[9]) for r in rows]
    assert len(rows) == made.jobs and max(ends) <= made.warmup_s + made.window_s


def test_guarantees_above_the_cluster_are_refused_or_scaled():
    tree = QueueTree([QueueSpec("org", guaranteed=ResourceVector({GPU_UNITS: 620_000})),
                      QueueSpec("team", parent="org", guaranteed=ResourceVector({GPU_UNITS: 310_000}),
                                limit=ResourceVector({GPU_UNITS: 620_000}))])
    nodes = [make_node(f"n{i}", gpus=7) for i in range(21)]  # 147 GPUs
    with pytest.raises(TraceError, match=r"q.yaml:1: column 'guaranteed': .* 620 GPUs, above the 147 .*"
                                         r"--scale-guarantees"):
        fit_guarantees(tree, nodes, False, "q.yaml")
    scaled = fit_guarantees(tree, nodes, True, "q.yaml")
    assert scaled.specs["org"].guaranteed[GPU_UNITS] == 147_000
    assert scaled.specs["team"].guaranteed[GPU_UNITS] == 73_500 and scaled.specs["team"].limit[GPU_UNITS] == 147_000
    assert fit_guarantees(scaled, nodes, False, "q.yaml") is scaled


def _next_command(stdout: str) -> list[str]:
    line = " ".join(stdout.split("next:", 1)[1].split())  # Rich wraps long lines
    words = shlex.split(line)
    assert words[:3] == ["gpupool", "sim", "replay"]
    return [*CLI, *words[2:], "--quiet", "--jobs", "2"]


@pytest.mark.slow
@pytest.mark.skipif(not OPENB.is_dir(), reason="needs the shared openb trace")
def test_generated_load_is_the_window_gar_and_overload_waits(tmp_path):
    """Done when (issue 44): `--load 0.9 --days 0.1`, then the printed `next:` command, gives a window GAR within
    10% of 0.9; `--load 1.3` gives waits."""
    nodes, source = OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv"
    env = {**os.environ, "COLUMNS": "100"}
    gar = {}
    for load in ("0.9", "1.3"):
        out = tmp_path / f"wl{load}.csv"
        queues = EXAMPLES / "openb-4-queues.yaml"
        gen = subprocess.run([*CLI, "generate", "--nodes", str(nodes), "--queues", str(queues),
                              "--source", str(source), "--load", load, "--days", "0.1", "--node-stride", "10",
                              "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert gen.returncode == 0, gen.stderr + gen.stdout
        command = _next_command(gen.stdout)
        assert "--node-stride" in command and command[command.index("--node-stride") + 1] == "10"
        if load == "1.3":
            command[command.index("fifo,default")] = "fifo"
        replay = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert replay.returncode == 0, replay.stderr + replay.stdout
        (run,) = json.loads((tmp_path / f"wl{load}-replay" / "summary.json").read_text())["runs"][:1]
        gar[load] = run["gar_window"]
        if load == "1.3":
            assert run["window"]["wait_s"]["p50"] > 0
        stated = json.loads((tmp_path / f"wl{load}.summary.json").read_text())
        assert stated["offered_load_in_window"] == pytest.approx(float(load), abs=0.01)
    print(f"window GAR at offered load 0.9: {gar['0.9']}")
    assert abs(gar["0.9"] - 0.9) <= 0.09
