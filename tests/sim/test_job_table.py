"""The generic job table (issue 44, item 1): its columns and units, the rules for missing times, gangs and
tenants, bad rows refused with file:line and column, and the shared Philly and Alibaba tables read as they are."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core.queues import GPU_UNITS
from gpupool.sim.experiment import replay_queues, submitted_between
from gpupool.sim.tenants import MAX_TENANT_QUEUES, OTHER, tenant_tree
from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.jobtable import is_job_table, read_jobs, read_workload
from gpupool.sim.traces.openb import pod_duration

SHARED = Path(os.environ.get("GPUPOOL_SHARED", "/work/shared")) / "traces" / "tenant-demand"
HEADER = "job_id,tenant,submit_time,start_time,end_time,duration_s,gpus,gang,cpus,memory_mib,gpu_model,priority\n"


def _table(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


def test_columns_units_and_time_rules(tmp_path):
    path = _table(tmp_path,
                  "a,vc1,100,110,200,,1,,2.5,4096,V100|A100,5",  # duration end - start
                  "b,vc1,100,,400,,0.25,,,,,",  # a quarter GPU; duration end - submit
                  "c,vc2,150,,,60,16,,,,,",  # explicit duration; 16 GPUs -> 2 tasks of 8
                  "d,,,,,,12,,,,,",  # present at the trace's start, running at its end
                  "e,vc2,120,,,30,6,3,3,300,,")  # a gang of 3 tasks of 2 GPUs, cpus and memory split
    jobs = {p.name: p for p in read_jobs(path)}
    a, b, c, d, e = (jobs[k] for k in "abcde")
    assert (a.creation_time, a.scheduled_time, pod_duration(a), a.priority, a.queue) == (100, 110, 90, 5, "vc1")
    assert (a.shape.cpu_milli, a.shape.memory_mib, a.shape.gpu_models) == (2500, 4096, ("A100", "V100"))
    assert (b.shape.gpu_count, b.shape.gpu_milli, pod_duration(b)) == (1, 250, 300)
    assert (c.gang, c.shape.gpu_count, pod_duration(c)) == (2, 8, 60)
    assert (d.creation_time, pod_duration(d), d.gang, d.shape.gpu_count, d.queue) == (100, 300, 2, 6, "")
    assert (e.gang, e.shape.gpu_count, e.shape.cpu_milli, e.shape.memory_mib) == (3, 2, 1000, 100)


def test_iso_times_and_the_utc_spelling(tmp_path):
    path = _table(tmp_path, "x,t,2017-10-02T00:00:00Z,2017-10-02T00:00:10Z,2017-10-02T01:00:10Z,1",
                  header="job_id,tenant,submit_time_utc,start_time_utc,end_time_utc,gpus\n")
    (x,) = read_workload(path)
    assert x.creation_time == 1506902400 and pod_duration(x) == 3600 and is_job_table(path)


@pytest.mark.parametrize(("row", "column", "words"), [
    ("x,t,abc,,,10,1,", "submit_time", "neither whole seconds nor an ISO-8601"),
    ("x,t,100,,,10,1.5,", "gpus", "GPUs are whole"),
    ("x,t,100,,,10,0.0001,", "gpus", "not within"),
    ("x,t,100,,,10,-1,", "gpus", "not within"),
    ("x,t,100,,,10,nan,", "gpus", "not within"),
    ("x,t,100,,,10,1e999,", "gpus", "not within"),
    ("x,t,100,,,0,1,", "duration_s", "below the minimum 1"),
    ("x,t,100,,50,,1,", "end_time", "before the job's start"),
    ("x,t,100,90,,,1,", "start_time", "before submit_time"),
    ("x,=cmd(),100,,,10,1,", "tenant", "starts with a letter or digit"),
    ("x,t,100,,,10,3,2", "gang", "do not split evenly"),
    ("x,t,100,,,10,128,1", "gang", "at most 64 per task"),
    ("x,t,2017-10-02,,,10,1,", "submit_time", "mixes whole seconds and ISO-8601"),
    (",t,100,,,10,1,", "job_id", "must not be empty"),
    ("ok,t,100,,,10,1,", "job_id", "must be unique"),
    ("x,t,100,,,10,1", "-", "expected 8 fields"),
])
def test_bad_rows_are_refused_with_file_line_and_column(tmp_path, row, column, words):
    path = _table(tmp_path, "ok,t,100,,,10,1,", row,
                  header="job_id,tenant,submit_time,start_time,end_time,duration_s,gpus,gang\n")
    with pytest.raises(TraceError) as caught:
        read_jobs(path)
    assert (caught.value.path, caught.value.line, caught.value.column) == (str(path), 3, column)
    assert words in str(caught.value) and "{'" not in str(caught.value)


def test_a_missing_required_column_is_named(tmp_path):
    with pytest.raises(TraceError, match=r"jobs.csv:1: column 'gpus': required column missing"):
        read_jobs(_table(tmp_path, "x,t,100", header="job_id,tenant,submit_time\n"))


def test_tenants_become_queues_by_the_documented_rule():
    demand = {f"t{i:02d}": 1000 * (i + 1) for i in range(MAX_TENANT_QUEUES + 3)}
    tree, leaf_of = tenant_tree(demand, 100_000)
    assert len(tree.leaves) == MAX_TENANT_QUEUES and leaf_of["t00"] == OTHER and leaf_of["t34"] == "t34"
    total = sum(demand.values())
    assert tree.specs["t34"].guaranteed[GPU_UNITS] == 100_000 * 35_000 // total
    assert sum(s.guaranteed[GPU_UNITS] for s in tree.specs.values()) <= 100_000


def test_submitted_window_and_tenant_queues_pick_jobs_and_leaves(tmp_path):
    pods = read_jobs(_table(tmp_path, "a,v1,100,,,10,1,,,,,", "b,v2,200,,,10,1,,,,,", "c,,300,,,10,1,,,,,"))
    assert [p.name for p in submitted_between(pods, 150, None)] == ["b", "c"]
    with pytest.raises(ValueError, match="--submitted"):
        submitted_between(pods, 400, 500)
    from gpupool.core.testing.builders import make_node
    tree, mapped, assign = replay_queues("tenants", "hash", pods, [make_node("n", gpus=4)])
    assert assign == "column" and [p.queue for p in mapped] == ["v1", "v2", "default"]
    assert tree is not None and set(tree.leaves) == {"v1", "v2", "default"}


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the shared tenant-demand traces")
def test_philly_and_alibaba_tables_replay_without_a_converter(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,262144,8,P100\n" for i in range(8)))
    for table, window in (("philly_jobs.csv", "2017-10-02T00:00:00Z,2017-10-02T02:00:00Z"),
                          ("alibaba_dlrm_v2025_jobs.csv", "2000-01-03T09:00:00Z,2000-01-03T12:00:00Z")):
        out = tmp_path / table
        run = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "sim", "replay", "--nodes", str(nodes),
                              "--pods", str(SHARED / table), "--queues", "tenants", "--profile", "fifo",
                              "--submitted", window, "--out", str(out), "--quiet", "--jobs", "1", "--no-timing"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr + run.stdout
        jobs = list(csv.DictReader((out / "jobs.csv").open()))
        assert jobs and len({j["queue"] for j in jobs}) > 1


JOB_CELLS = st.sampled_from(["", "0", "1", "-1", "0.5", "1.5", "0.0004", "1e999", "nan", "inf", "16", "3", "64",
                             "2017-10-02T00:00:00Z", "2017-10-02 00:00:01", "2017-13-40", "0001-01-01", "9" * 30,
                             "=x", "a", "a|b", "\x00", "é", '"', " 7 "])
JOB_HEADER = "job_id,tenant,submit_time,start_time,end_time,duration_s,gpus,gang\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(JOB_CELLS, min_size=7, max_size=9), max_size=6))
def test_fuzzed_job_tables_give_bounded_jobs_or_a_file_line_error(tmp_path, rows):
    path = tmp_path / "fuzzed.csv"
    path.write_text(JOB_HEADER + "".join(",".join(row) + "\n" for row in rows), errors="surrogatepass")
    try:
        pods = read_jobs(path)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}:{exc.line}: column ") and 1 <= exc.line <= len(rows) + 2
        return
    times = [t for p in pods for t in (p.creation_time, p.deletion_time) if t is not None]
    assert max(times) - min(times) <= 2 * 10 * 365 * 86_400
    for pod in pods:
        assert 1 <= pod.gang <= 1024 and 1 <= pod.shape.gpu_count <= 64 and 0 < pod.shape.gpu_milli <= 1000
        assert pod.deletion_time > pod.creation_time - 1
