"""A job's log is capped on the control plane's disk, its tail kept (issue 41, finding 9; figure S18).

A real agent runs a job that writes four times the cap (GPUPOOL_MAX_LOG_BYTES_PER_JOB, set small) as fast as it can.
Once its log has arrived, the control plane holds at most the cap for that attempt, and the API and `gpupool job logs`
answer one marker line saying how many bytes were cut, then exactly the last bytes the job wrote.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # agent_cluster

from agent_cluster import JOB_PYTHON, SCALED, Cluster  # noqa: E402

from gpupool.devtools.harness import wait_for  # noqa: E402
from gpupool.server.joblogs import JobLogs  # noqa: E402
from gpupool.server.settings import Settings  # noqa: E402

CAP = 256 * 1024
LINES = 16_384  # of 64 bytes: 1 MiB, four times the cap
WRITER = "import sys\nfor i in range({n}):\n    sys.stdout.write(f'line {{i:09d}} ' + 'x' * 48 + '\\n')\n"
MARKER = re.compile(r"\[gpupool: (\d+) bytes of this log were cut here; [^\n]*\]\n")


def written() -> str:
    """What the job writes, byte for byte."""
    return "".join(f"line {i:09d} " + "x" * 48 + "\n" for i in range(LINES))


def read_log(api: httpx.Client, job_id: str) -> str:
    """The whole log as the API serves it, following X-Next-Offset from 0."""
    text, offset = "", 0
    while True:
        response = api.get(f"/jobs/{job_id}/logs", params={"offset": offset})
        assert response.status_code == 200, response.text
        if not response.text:
            return text
        text += response.text
        offset = int(response.headers["X-Next-Offset"])


def stored_bytes(logs: Path, allocation_id: str) -> int:
    """Bytes on disk for the allocation's logs: every file whose name, or whose folder's name, is the allocation's."""
    return sum(p.stat().st_size for p in logs.rglob("*") if p.is_file()
               and allocation_id in (p.name.split("-")[0], p.parent.name.split("-")[0]))


def test_a_fast_writer_keeps_the_tail_under_the_cap(tmp_path: Path, s18: Any) -> None:
    env = {**SCALED, "GPUPOOL_MAX_LOG_BYTES_PER_JOB": str(CAP)}
    with Cluster(tmp_path, env=env) as cluster:
        cluster.start_agent("n1")
        cluster.wait_ready(["n1"])
        job_id = cluster.submit(command=[JOB_PYTHON, "-c", WRITER.format(n=LINES)], gpus="1")
        assert cluster.wait_job(job_id, timeout_s=60)["state"] == "succeeded"
        last = f"line {LINES - 1:09d} " + "x" * 48 + "\n"
        wait_for(lambda: read_log(cluster.api, job_id).endswith(last), 60, "the whole log")
        # read again once all has arrived: a read that overlapped the arrival may carry a second marker where the
        # store cut bytes between two of its requests, which is the store's contract, not this test's subject
        text = read_log(cluster.api, job_id)
        assert cluster.server is not None
        stored = stored_bytes(cluster.server.data_dir / "logs", cluster.job(job_id)["allocations"][0]["id"])
        cli = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "job", "logs", job_id], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "GPUPOOL_URL": cluster.url,
                                                          "GPUPOOL_TOKEN": cluster.server.token})
    marker = MARKER.match(text)
    cut = int(marker[1]) if marker else 0
    tail = text[marker.end():] if marker else text
    kept_tail = marker is not None and tail == written()[cut:] and CAP // 2 <= stored <= CAP
    s18.add("log", cap_bytes=CAP, kept_tail="ok" if kept_tail else "no")
    assert marker is not None, f"no marker line; the log starts {text[:200]!r}"
    assert tail == written()[cut:], "what follows the marker is not the exact tail of what the job wrote"
    assert cut + len(tail) == len(written())
    assert CAP // 2 <= stored <= CAP, f"{stored} bytes stored for a cap of {CAP}"
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr
    differs = next((i for i, (a, b) in enumerate(zip(cli.stdout, text, strict=False)) if a != b), None)
    assert cli.stdout == text, (f"`gpupool job logs` printed {len(cli.stdout)} characters, the API served {len(text)};"
                                f" first difference at {differs}: {cli.stdout[:300]!r}")
    assert cluster.violations == []


# the store itself, on real files: the agent's way of sending (in order, re-sending after a reconnect) ---------------


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, bytes]]]:
    """A log and the chunks an agent sends for it: cut at arbitrary points, in order, and after a reconnect the
    last few unacknowledged ones again."""
    log = draw(st.binary(min_size=1, max_size=400_000))
    cuts = sorted(set(draw(st.lists(st.integers(1, len(log) - 1), max_size=40)) if len(log) > 1 else []))
    bounds = [0, *cuts, len(log)]
    chunks = [(a, log[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b - a <= 32 * 1024]
    if len(chunks) != len(bounds) - 1:  # a gap the agent would never leave: send it whole instead
        chunks = [(a, log[a:a + 32 * 1024]) for a in range(0, len(log), 32 * 1024)]
    sent: list[tuple[int, bytes]] = []
    for i, chunk in enumerate(chunks):
        sent.append(chunk)
        if draw(st.integers(0, 9)) == 0:
            sent.extend(chunks[max(0, i - draw(st.integers(0, 3))):i + 1])  # a reconnect re-sends these
    return log, sent


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(deliveries())
def test_the_store_keeps_the_exact_tail_within_the_cap(tmp_path: Path, delivery: tuple[bytes, list]) -> None:
    log, sent = delivery
    logs = JobLogs(tmp_path / f"logs-{len(list(tmp_path.iterdir()))}", 64 * 1024)
    for offset, data in sent:
        logs.append("a", 0, offset, data)
    text, end = logs.read("a", 0, 0, 1 << 20)
    marker = re.match(rb"\[gpupool: (\d+) bytes of this log were cut here; [^\n]*\]\n", text)
    cut = int(marker[1]) if marker else 0
    assert end == len(log) and text[marker.end() if marker else 0:] == log[cut:]
    stored = sum(s.path.stat().st_size for s in logs.segments("a", 0))
    assert stored <= 64 * 1024 and stored >= min(len(log), 32 * 1024)


def test_a_reader_behind_the_cut_is_told_how_much_it_missed(tmp_path: Path) -> None:
    logs = JobLogs(tmp_path, 64 * 1024)
    log = bytes(range(256)) * 1024  # 256 KiB
    for offset in range(0, len(log), 16 * 1024):
        logs.append("a", 0, offset, log[offset:offset + 16 * 1024])
    first = logs.segments("a", 0)[0].start
    text, end = logs.read("a", 0, 1000, 10)
    assert text.startswith(f"[gpupool: {first - 1000} bytes of this log were cut here;".encode())
    assert text.endswith(b"\n" + log[first:first + 10]) and end == first + 10
    assert logs.read("a", 0, first + 5, 3) == (log[first + 5:first + 8], first + 8)  # no marker once past the cut
    assert logs.read("a", 0, len(log), 10) == (b"", len(log))
    logs.append("a", 0, len(log) + 1, b"gap")  # a chunk past the end (one is missing) is dropped
    logs.append("a", 0, 0, b"stale")  # so is one within a segment no longer kept
    assert logs.read("a", 0, first, 1 << 20) == (log[first:], len(log))


def test_the_cap_defaults_to_100_mib_and_a_tiny_one_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_log_bytes_per_job == 100 << 20
    monkeypatch.setenv("GPUPOOL_MAX_LOG_BYTES_PER_JOB", "1000")
    with pytest.raises(ValueError, match="GPUPOOL_MAX_LOG_BYTES_PER_JOB"):
        Settings.from_env()
