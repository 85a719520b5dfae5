"""Plugins out of tree (issue 44, item 3): the example package of the plugin guide (docs/simulator/plugins.md),
installed with pip into a temporary folder, runs by name in `sim fill` against fgd, in `sim replay` profiles, and in
a control plane's profile; names no registry knows are refused."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.core import installed_registry, placement_profile, scheduling_profile
from gpupool.core.framework import VictimPlugin
from gpupool.core.model import JobSpec
from gpupool.core.registry import default_registry
from gpupool.devtools.harness import start_server, stop_server
from gpupool.sim.synthetic import write_synthetic

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpupool-plugin-example"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """PYTHONPATH with the example package pip-installed into a temporary folder (the shared venv stays as it
    is), then gpupool's source."""
    base = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(EXAMPLE, base / "source")  # the build leaves build/ and *.egg-info beside it
    target = base / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                              "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    return os.pathsep.join([str(target), str(ROOT / "src")])


def _sim(plugin_path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpupool.cli.main", "sim", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": plugin_path, "COLUMNS": "160"})


def test_the_example_plugin_runs_by_name_in_fill_against_fgd(plugin_path, tmp_path):
    nodes, pods = write_synthetic(tmp_path / "syn")
    run = _sim(plugin_path, "fill", "--nodes", str(nodes), "--pods", str(pods), "--policy", "gpu_tight,fgd",
               "--seeds", "42", "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet", "--no-timing")
    assert run.returncode == 0, run.stderr + run.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (figures,) = summary["traces"].values()
    assert set(figures) == {"gpu_tight", "fgd"} and figures["gpu_tight"]["at_100"]["mean"] > 50
    without = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "sim", "fill", "--nodes", str(nodes),
                              "--pods", str(pods), "--policy", "gpu_tight"], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert without.returncode == 2 and "unknown 'gpu_tight'" in without.stderr + without.stdout


def test_a_plugin_swaps_into_a_replay_profile(plugin_path, tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,A100\n")
    jobs = tmp_path / "jobs.csv"
    # one GPU busy until 100; then the shortest of the waiting jobs goes first, whatever its submission
    jobs.write_text("job_id,tenant,submit_time,duration_s,gpus\nbig,t,0,100,2\nlong,t,1,500,2\nshort,t,2,5,2\n")
    run = _sim(plugin_path, "replay", "--nodes", str(nodes), "--pods", str(jobs), "--queues", "tenants",
               "--profile", "fifo,fifo+shortest_first", "--estimates", "exact", "--policy", "gpu_tight",
               "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet")
    assert run.returncode == 0, run.stderr + run.stdout
    with (tmp_path / "out" / "jobs.csv").open() as handle:
        starts = {(r["policy"], r["job"]): r["start_s"] for r in csv.DictReader(handle)}
    assert starts[("fifo", "long")] == "100" and starts[("fifo+shortest_first", "short")] == "100"


def test_a_control_plane_runs_a_plugin_profile_and_refuses_an_unknown_one(plugin_path, tmp_path):
    env = {"PYTHONPATH": plugin_path, "GPUPOOL_PLACEMENT": "gpu_tight", "GPUPOOL_PROFILE": "default+shortest_first"}
    stop_server(start_server(tmp_path / "cp" / "data", env=env))  # ready: its scheduler loop built the profile
    with pytest.raises(RuntimeError, match="not a registered queue-order, victim or score plugin"):
        start_server(tmp_path / "cp2" / "data", env={**env, "GPUPOOL_PROFILE": "default+no_such_plugin"})


class _YoungestFirst(VictimPlugin):
    name = "youngest_first"

    def order_victims(self, preemptor: JobSpec, candidates):  # type: ignore[no-untyped-def]
        return sorted(candidates, key=lambda t: (-t.started_at, t.task_id))


def test_profile_names_resolve_plugins_by_the_point_they_implement():
    registry = default_registry()
    registry.register(_YoungestFirst)
    profile = scheduling_profile("fair-share+youngest_first", "bestfit", registry)
    assert (profile.victims, profile.queue_order, profile.name) == ("youngest_first", "fair_share",
                                                                     "fair-share+youngest_first")
    assert scheduling_profile("youngest_first", "bestfit", registry).actions == ("allocate",)
    with pytest.raises(ValueError, match="unknown 'nope'"):
        scheduling_profile("nope", "bestfit", registry)
    with pytest.raises(ValueError, match="unknown 'youngest_first'"):
        placement_profile("youngest_first", registry)  # a victim order is no placement policy
    assert "youngest_first" not in installed_registry().plugins
