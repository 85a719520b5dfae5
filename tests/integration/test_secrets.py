"""Job secrets end to end (RELIABILITY.md S9): a real control plane and a real agent with fake GPUs on loopback.

A job's `secret_env` reaches its workload's environment (the workload prints a SHA-256 of it, so its log proves the
value without holding it), across two master-key rotations made while the control plane runs: a job submitted
before a rotation still launches after it, and one submitted after it too. Then the plaintext is nowhere on
either machine's disk: the control plane's data dir (database, WAL, job logs), the agent's (workload state, logs)
and both processes' logs.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from agent_cluster import JOB_PYTHON, Cluster

from gpupool.devtools.figures import figure

pytestmark = pytest.mark.slow

PRINT_DIGEST = [JOB_PYTHON, "-c", "import hashlib, os; print('digest=' + hashlib.sha256("
                "os.environ['GP_SECRET'].encode()).hexdigest(), 'plain=' + os.environ.get('GP_PLAIN', ''))"]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _rotate(cluster: Cluster) -> int:
    assert cluster.server is not None
    done = subprocess.run([sys.executable, "-m", "gpupool.server", "rotate-master-key", "--data-dir",
                           str(cluster.server.data_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("undecryptable=")[1].split()[0])


def _hits(folder: Path, needles: list[str]) -> dict[str, int]:
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            count = sum(path.read_bytes().count(n.encode()) for n in needles)
            if count:
                found[str(path.relative_to(folder))] = count
    return found


def test_a_secret_reaches_only_the_workload_across_master_key_rotations(cluster: Cluster) -> None:
    values = [secrets.token_urlsafe(24) for _ in range(2)]
    before = cluster.submit(command=PRINT_DIGEST, gpus="1", secret_env={"GP_SECRET": values[0]},
                            env={"GP_PLAIN": "visible"})
    undecryptable = [_rotate(cluster)]  # no agent yet: `before` launches only after this rotation
    cluster.start_agent("a")
    cluster.wait_ready(["a"])
    after = cluster.submit(command=PRINT_DIGEST, gpus="1", secret_env={"GP_SECRET": values[1]})
    for job_id, value in ((before, values[0]), (after, values[1])):
        job = cluster.wait_job(job_id)
        assert job["state"] == "succeeded" and job["secret_env"] == ["GP_SECRET"], job
        assert f"digest={_digest(value)}" in cluster.logs(job_id)
    assert "plain=visible" in cluster.logs(before)
    undecryptable.append(_rotate(cluster))
    again = cluster.submit(command=PRINT_DIGEST, gpus="1", secret_env={"GP_SECRET": values[0]})
    assert cluster.wait_job(again)["state"] == "succeeded"
    assert f"digest={_digest(values[0])}" in cluster.logs(again)
    shown = [cluster.api.get(f"/jobs/{j}").text + cluster.api.get(f"/jobs/{j}/events").text
             for j in (before, after, again)]
    assert not any(v in text for v in values for text in shown)
    assert cluster.server is not None
    hits = _hits(cluster.root, values)  # control plane data dir and log, agent data dir and log
    figure(f"S9  plaintext_hits={sum(hits.values())} (db,wal,job logs,agent dir,logs) "
           f"rotation_undecryptable={max(undecryptable)} (a real agent ran 3 secret jobs across 2 rotations)")
    assert hits == {} and undecryptable == [0, 0]
