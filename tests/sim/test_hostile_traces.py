"""Hostile trace, workload, queue and summary files (issue 41, finding 18; figure S18).

Each case is a file someone could be handed to simulate. `gpupool sim` run on it must end within 10 s (beyond the
start-up of a run that fails at once, measured just before) with one line, `error: FILE:LINE: ...`, naming the
hostile file, and no traceback, with a peak resident set under 300 MB (wait4's figure for the process itself).
A Hypothesis fuzzer then drives the readers with arbitrary files: each returns what it read, within the bounds, or
raises TraceError naming the file and a line of it; never anything else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.core import QueueTree
from gpupool.devtools.figures import Parts, session_folder
from gpupool.sim.tenants import load_queues
from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.openb import read_nodes, read_pods

WORK_S = 10.0
RSS_LIMIT_MB = 300
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
               "creation_time", "deletion_time", "scheduled_time")
WORKLOAD_COLUMNS = (*POD_COLUMNS, "queue", "user", "gang", "runtime_limit_s")
POD = {"name": "p1", "cpu_milli": "1000", "memory_mib": "1024", "num_gpu": "1", "gpu_milli": "1000", "gpu_spec": "",
       "qos": "LS", "pod_phase": "Running", "creation_time": "0", "deletion_time": "100", "scheduled_time": "0",
       "queue": "a", "user": "u", "gang": "1", "runtime_limit_s": ""}
GOOD = {"nodes.csv": (NODE_HEADER + "n0,64000,262144,8,A100\n").encode(),
        "pods.csv": (",".join(POD_COLUMNS) + "\n" + ",".join(POD[c] for c in POD_COLUMNS) + "\n").encode(),
        "queues.yaml": b"queues:\n  - name: a\n    guaranteed: {gpus: 4}\n"}


def pods(columns: tuple[str, ...] = POD_COLUMNS, **fields: str) -> bytes:
    """A pod list of one good pod and one with `fields` changed, in `columns`."""
    rows = ({c: c for c in columns}, POD, {**POD, "name": "p2", **fields})
    return "".join(",".join(row[c] for c in columns) + "\n" for row in rows).encode()


def both_pods(**fields: str) -> bytes:
    """A pod list of two pods, both with `fields` changed."""
    rows = ({c: c for c in POD_COLUMNS}, {**POD, **fields}, {**POD, "name": "p2", **fields})
    return "".join(",".join(row[c] for c in POD_COLUMNS) + "\n" for row in rows).encode()


def workload(**fields: str) -> bytes:
    return pods(WORKLOAD_COLUMNS, **fields)


def queue_file(*lines: str) -> bytes:
    return ("queues:\n  - name: a\n" + "".join(f"    {line}\n" for line in lines)).encode()


@dataclass(frozen=True)
class Case:
    name: str
    command: str  # fill, replay, replay-queues, generate or compare
    culprit: str  # the file the error names: nodes.csv, pods.csv, queues.yaml or summary.json
    content: Callable[[], bytes]
    nodes: Callable[[], bytes] | None = None  # a node list in place of the good one


CASES = [
    Case("node_of_1e9_gpus", "fill", "nodes.csv", lambda: (NODE_HEADER + "n0,64000,262144,1000000000,A100\n").encode()),
    Case("gpu_count_of_4000_digits", "fill", "nodes.csv",
         lambda: (NODE_HEADER + f"n0,64000,262144,{'9' * 4000},A100\n").encode()),
    Case("num_gpu_1e12_deletion_1e30", "replay", "pods.csv",
         lambda: pods(num_gpu=str(10**12), deletion_time=str(10**30))),
    Case("deletion_time_1e30", "replay", "pods.csv", lambda: pods(deletion_time=str(10**30))),
    Case("field_of_200kB", "fill", "pods.csv", lambda: pods(name="x" * 200_000)),
    Case("quoted_field_of_200kB_over_lines", "fill", "pods.csv",
         lambda: pods(name='"' + ("y" * 999 + "\n") * 200 + '"')),
    Case("line_of_10MB_without_newline", "fill", "nodes.csv",
         lambda: (NODE_HEADER + "n0,64000,262144,8," + "A" * 10_000_000).encode()),
    Case("line_of_3M_fields", "fill", "nodes.csv", lambda: (NODE_HEADER + "n0" + ",1" * 3_000_000 + "\n").encode()),
    Case("invalid_utf8", "fill", "pods.csv", lambda: pods(name="p2").replace(b"p2,", b"p\xff\xfe,")),
    Case("nul_in_a_number", "fill", "pods.csv", lambda: pods(cpu_milli="10\x0000")),
    Case("memory_of_1e18_mib", "replay", "pods.csv", lambda: pods(memory_mib=str(10**18))),
    Case("gang_of_1e9_tasks", "replay", "pods.csv", lambda: workload(gang=str(10**9))),
    Case("a_thousand_gangs_of_a_thousand", "replay", "pods.csv",
         lambda: b"".join([workload()] + [workload(name=f"g{i}", gang="1000").splitlines(keepends=True)[-1]
                                          for i in range(1000)])),
    Case("runtime_limit_of_1e30_s", "replay", "pods.csv", lambda: workload(runtime_limit_s=str(10**30))),
    Case("a_million_nodes", "fill", "nodes.csv",
         lambda: (NODE_HEADER + "".join(f"n{i},1,1,0,\n" for i in range(1_000_000))).encode()),
    Case("a_million_pods", "fill", "pods.csv",
         lambda: ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                  + "".join(f"p{i},0,0,0,0\n" for i in range(1_000_000))).encode()),
    Case("header_only_pod_list", "replay", "pods.csv", lambda: (",".join(POD_COLUMNS) + "\n").encode()),
    Case("no_pod_asks_for_a_gpu", "fill", "pods.csv", lambda: both_pods(num_gpu="0", gpu_milli="0")),
    Case("tenths_of_a_gpu_to_fill_128000_gpus", "fill", "pods.csv", lambda: both_pods(gpu_milli="100"),
         nodes=lambda: (NODE_HEADER + "".join(f"n{i},64000,262144,64,A100\n" for i in range(2000))).encode()),
    Case("guarantee_of_1e999999999_gpus", "replay-queues", "queues.yaml",
         lambda: queue_file("guaranteed: {gpus: 1e999999999}")),
    Case("weight_of_5000_digits", "replay-queues", "queues.yaml",
         lambda: queue_file(f"over_quota_weight: {'9' * 5000}")),
    Case("infinite_weight", "replay-queues", "queues.yaml", lambda: queue_file("over_quota_weight: .inf")),
    Case("queue_file_nested_100000_deep", "replay-queues", "queues.yaml",
         lambda: b"queues: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"),
    Case("ten_thousand_queues", "replay-queues", "queues.yaml",
         lambda: ("queues:\n" + "".join(f"  - name: q{i}\n" for i in range(10_000))).encode()),
    Case("queue_named_like_a_formula", "replay-queues", "queues.yaml",
         lambda: b"queues:\n  - name: a\n  - name: '=HYPERLINK(\"evil.example\")'\n"),
    Case("generate_from_a_hostile_source", "generate", "pods.csv", lambda: pods(name="x" * 200_000)),
    Case("summary_not_json", "compare", "summary.json", lambda: b'{"traces": {\n'),
    Case("summary_of_another_shape", "compare", "summary.json", lambda: b'{"traces": [1, 2]}\n'),
    Case("summary_with_a_mean_of_text", "compare", "summary.json",
         lambda: b'{"traces": {"t": {"p": {"at_130": {"mean": "high"}}}}}'),
    Case("summary_nested_100000_deep", "compare", "summary.json", lambda: b"[" * 100_000 + b"]" * 100_000),
]


def sim_command(case: Case, folder: Path) -> list[str]:
    files = {name: folder / name for name in ("nodes.csv", "pods.csv", "queues.yaml")}
    out = folder / "out"
    base = [sys.executable, "-m", "gpupool.cli.main", "sim"]
    if case.command == "fill":
        return [*base, "fill", "--nodes", str(files["nodes.csv"]), "--pods", str(files["pods.csv"]), "--out", str(out),
                "--jobs", "1", "--quiet"]
    if case.command.startswith("replay"):
        queues = ["--queues", str(files["queues.yaml"]), "--profile", "fifo"] if case.command == "replay-queues" else []
        return [*base, "replay", "--nodes", str(files["nodes.csv"]), "--pods", str(files["pods.csv"]), "--out",
                str(out), "--jobs", "1", "--quiet", *queues]
    if case.command == "generate":
        return [*base, "generate", "--nodes", str(files["nodes.csv"]), "--queues", str(files["queues.yaml"]),
                "--source", str(files["pods.csv"]), "--out", str(out / "workload.csv")]
    return [*base, "compare", str(folder)]


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    wall_s: float
    peak_rss_mb: float


#: runs argv[2:] as its child and writes the child's peak RSS (KiB, from wait4) to argv[1]. Measured from the test
#: process itself, the figure would include the test's own memory: Linux carries the high-water mark of the process
#: that forked through exec into ru_maxrss. This small process forks instead.
SHIM = """import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""


def run_measured(command: list[str], limit_s: float, log: Path) -> Run:
    """Run `command` (output to `log`), killed at `limit_s`: its exit status, output, wall time and peak RSS."""
    peak = log.with_suffix(".rss")
    with log.open("wb") as out:
        start = time.monotonic()
        process = subprocess.Popen([sys.executable, "-c", SHIM, str(peak), *command], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    timer = threading.Timer(limit_s, os.killpg, (process.pid, signal.SIGKILL))
    timer.start()
    try:
        process.wait()
    finally:
        timer.cancel()
    wall = time.monotonic() - start
    rss_mb = int(peak.read_text()) / 1024 if peak.exists() else float("inf")
    return Run(process.returncode, log.read_text(errors="replace"), wall, rss_mb)


@pytest.fixture(scope="module")
def startup_s(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Wall time of a run that fails at once (an empty node list): what every case pays before it reads a byte."""
    folder = tmp_path_factory.mktemp("startup")
    for name, content in GOOD.items():
        (folder / name).write_bytes(content)
    (folder / "nodes.csv").write_bytes(b"")
    runs = [run_measured(sim_command(Case("empty", "fill", "nodes.csv", bytes), folder), 120, folder / "log")
            for _ in range(2)]
    assert all("nodes.csv:1:" in r.output for r in runs), runs[0].output
    return min(r.wall_s for r in runs)


@pytest.fixture(scope="module")
def trace_parts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Parts:
    return Parts(session_folder(tmp_path_factory.getbasetemp(), worker_id, "s18-traces"), [c.name for c in CASES])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_file_ends_the_run_with_a_file_line_error(case: Case, tmp_path: Path, startup_s: float,
                                                            trace_parts: Parts, s18: Any) -> None:
    for name, content in GOOD.items():
        (tmp_path / name).write_bytes(content)
    if case.nodes is not None:
        (tmp_path / "nodes.csv").write_bytes(case.nodes())
    culprit = tmp_path / case.culprit
    culprit.write_bytes(case.content())
    limit = startup_s + WORK_S
    run = run_measured(sim_command(case, tmp_path), limit, tmp_path / "log")
    lines = [line for line in run.output.splitlines() if line.strip()]
    match = re.fullmatch(rf"error: {re.escape(str(culprit))}:(\d+): .+", lines[0]) if len(lines) == 1 else None
    lines_in_file = culprit.read_bytes().count(b"\n") + 1
    file_line = match is not None and run.returncode == 2 and 1 <= int(match[1]) <= lines_in_file
    ended = run.returncode >= 0 and run.wall_s <= limit
    found = trace_parts.add(case.name, ended=ended, file_line=file_line, rss=run.peak_rss_mb)
    if found is not None:
        s18.add("traces", cases=len(found), ended=sum(p["ended"] for p in found.values()),
                file_line=sum(p["file_line"] for p in found.values()),
                peak_rss_mb=round(max(p["rss"] for p in found.values())))
    assert ended, f"still running after {run.wall_s:.1f} s (start-up {startup_s:.1f} s): killed"
    assert file_line, f"exit {run.returncode}, not one `error: {culprit}:LINE:` line:\n{run.output[-3000:]}"
    assert "Traceback" not in run.output
    assert run.peak_rss_mb < RSS_LIMIT_MB, f"peak RSS {run.peak_rss_mb:.0f} MB"


def test_debug_shows_the_traceback_of_an_unexpected_error(tmp_path: Path) -> None:
    """An error that is not the file's fault is one line too, and --debug shows where it came from."""
    (tmp_path / "out").write_text("a file where the output folder should be")
    for name, content in GOOD.items():
        (tmp_path / name).write_bytes(content)
    command = sim_command(Case("unwritable", "fill", "nodes.csv", bytes), tmp_path)
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and "Traceback" not in plain.stdout + plain.stderr
    assert "--debug" in plain.stdout and "FileExistsError" in plain.stdout
    debug = subprocess.run([*command[:4], "--debug", *command[4:]], capture_output=True, text=True, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stdout + debug.stderr


# the fuzzer ---------------------------------------------------------------------------------------------------

CELLS = st.one_of(
    st.sampled_from(["0", "1", "8", "64", "65", "1000", "1001", "-1", "+3", "", " ", "A100", "T4|A100", "|", "x",
                     "9" * 25, "1e30", "nan", "inf", '"', '""', "\n", "\r\n", "=1+1", "@SUM(A1)", "\x00", "é",
                     str(10 * 365 * 86_400 + 1), "315360000"]),
    st.text(max_size=12))
HEADERS = st.sampled_from([NODE_HEADER.strip().split(","), list(POD_COLUMNS), list(WORKLOAD_COLUMNS),
                           ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]])
FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    header = draw(st.one_of(HEADERS, st.lists(CELLS, max_size=6)))
    rows = draw(st.lists(st.lists(CELLS, min_size=max(0, len(header) - 1), max_size=len(header) + 1), max_size=5))
    text = "\n".join(",".join(row) for row in [header, *rows]).encode(errors="surrogatepass")
    return draw(st.one_of(st.just(text), st.binary(max_size=64).map(lambda junk: text + junk)))


YAML_VALUES = st.one_of(st.sampled_from([0, 1, -1, 1e30, float("inf"), float("nan"), 10**30, "4", "0.5", "lots",
                                         "1e999999999", None, True, "=x", "a", "b", "a/b"]),
                        st.dictionaries(st.sampled_from(["gpus", "cpus", "memory_mib", "gpus:A100", "x"]),
                                        st.sampled_from([1, "2.5", -1, 1e30, "1e999999999", None, [1]]), max_size=3))
QUEUE_KEYS = st.sampled_from(["name", "parent", "guaranteed", "limit", "over_quota_weight", "borrow_limit",
                              "lend_limit", "priority", "preempt_min_runtime_s", "reclaim_min_runtime_s", "colour"])


@st.composite
def queue_files(draw: st.DrawFn) -> bytes:
    queues = draw(st.lists(st.dictionaries(QUEUE_KEYS, YAML_VALUES, max_size=5), max_size=4))
    document: Any = {"queues": queues, **draw(st.sampled_from([{}, {"gpu_units": {"A100": 2000}},
                                                                {"gpu_units": {"A100": 1e30}}]))}
    text = yaml.safe_dump(document).encode()
    cut = draw(st.integers(0, len(text)))
    return draw(st.sampled_from([text, text[:cut], text[:cut] + b"[{&*!|>%@`" + text[cut:]]))


def _checked(path: Path, read: Callable[[Path], Any]) -> Any:
    """What `read` returns, or None after checking its TraceError names the file and a line of it."""
    try:
        return read(path)
    except TraceError as exc:
        assert str(exc).startswith(f"{path}:{exc.line}: ")
        assert 0 <= exc.line <= path.read_bytes().count(b"\n") + 1
        return None


def test_fuzzed_files_give_bounded_values_or_a_file_line_error(tmp_path: Path, s18: Any) -> None:
    examples = {"nodes": 0, "pods": 0, "queues": 0}
    path = tmp_path / "fuzzed"

    @FUZZ
    @given(csv_files())
    def nodes(content: bytes) -> None:
        examples["nodes"] += 1
        path.write_bytes(content)
        for node in _checked(path, read_nodes) or []:
            assert len(node.gpus) <= 64 and node.cpu_milli <= 10**7 and node.memory_mib <= 1 << 26

    @FUZZ
    @given(csv_files())
    def pod_lists(content: bytes) -> None:
        examples["pods"] += 1
        path.write_bytes(content)
        for pod in _checked(path, read_pods) or []:
            assert pod.shape.gpu_count <= 64 and 1 <= pod.gang <= 1024 and len(pod.name) <= 256
            times = (pod.creation_time, pod.deletion_time, pod.scheduled_time, pod.runtime_limit_s)
            assert all(t is None or 0 <= t <= 10 * 365 * 86_400 for t in times)

    @FUZZ
    @given(queue_files())
    def queue_trees(content: bytes) -> None:
        examples["queues"] += 1
        path.write_bytes(content)
        tree = _checked(path, load_queues)
        assert tree is None or isinstance(tree, QueueTree) and len(tree.specs) <= 1000

    nodes()
    pod_lists()
    queue_trees()
    s18.add("fuzz", examples=sum(examples.values()))
    assert min(examples.values()) >= 100, examples


def test_a_summary_json_the_simulator_wrote_still_compares(tmp_path: Path) -> None:
    """The checks on summary.json refuse nothing a real run writes."""
    summary = {"traces": {"default": {"fgd": {"at_100": {"mean": 90.0, "sd": 0.0}, "at_130": {"mean": 95.0}}},
                          "wl": {"fifo": {"seeds": 1, "mean_wait_s": 12.5}}}}  # a fill's figures and a replay's
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "sim", "compare", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout) == {str(tmp_path): summary}
