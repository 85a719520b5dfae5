"""T6 (RELIABILITY.md §3.1): the control plane's disk fills up under load (SQLite).

The control plane's data directory (database, job logs) is a 32 MiB filesystem of its own: a tmpfs, else a loop
device; the test is skipped, with the reason, where neither can be mounted. Agents run short jobs while a client
submits (every submission with an Idempotency-Key, retried until a 201). Then, in each episode, a ballast file
fills the filesystem to the last byte, stays for a while, and is removed. Measured and asserted:

* while full, the API answers 507 (or 503) with Retry-After, and never a 500;
* nothing acknowledged is lost, nothing is half-written (the invariant checker: I1, I3-I5, I7, I8);
* a write succeeds again within 10 s of the ballast's removal (`recover_s`, the worst episode);
* PRAGMA integrity_check is ok at the end, and every acknowledged job ran to its end.

PR tier: 2 episodes held 3 s (RELIABILITY.md's 60 s scaled by 1/20). GPUPOOL_SOAK=1: 3 episodes held 60 s.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from agent_cluster import JOB_PYTHON, SCALED, Cluster, wait_for
from crashkit import Submission, Submitter, integrity_ok, jobs_per_key
from sqlalchemy.exc import OperationalError

from gpupool.devtools.figures import figure, soak
from gpupool.server.check import run_checks
from gpupool.server.unavailable import storage_full

pytestmark = pytest.mark.slow
SIZE_MIB = 32
EPISODES, HOLD_S = (3, 60.0) if soak() else (2, 3.0)
TERMINAL = ("succeeded", "failed", "cancelled")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def small_disk(mount_point: Path) -> Iterator[str]:
    """A SIZE_MIB filesystem mounted at `mount_point` (a tmpfs, else an ext4 loop device); yields its kind.
    Skips the test, saying why, when neither can be mounted (no root, no mount permission in the container)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    tried = _run("mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0700", "tmpfs", str(mount_point))
    kind, image = "tmpfs", None
    if tried.returncode != 0:
        image = mount_point.with_suffix(".img")
        with open(image, "wb") as handle:
            handle.truncate(SIZE_MIB << 20)
        made = _run("mkfs.ext4", "-q", "-F", str(image))
        looped = _run("mount", "-o", "loop", str(image), str(mount_point)) if made.returncode == 0 else made
        if looped.returncode != 0:
            pytest.skip(f"T6 needs a small filesystem: `mount -t tmpfs` failed ({tried.stderr.strip()}) and a loop "
                        f"device failed ({looped.stderr.strip()}); RLIMIT_FSIZE would not make SQLite see a full disk")
        kind = "loop"
    try:
        yield kind
    finally:
        _run("umount", "-l", str(mount_point))
        if image is not None:
            image.unlink(missing_ok=True)


def fill(path: Path) -> int:
    """Write `path` until the filesystem refuses a single byte more; returns the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as ballast:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += ballast.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written


@dataclass
class Episodes:
    statuses_while_full: dict[int, int] = field(default_factory=dict)
    retry_after_missing: int = 0
    recover_s: list[float] = field(default_factory=list)
    acked: dict[str, str] = field(default_factory=dict)  # probe key -> job id, from 201 answers


def probe_while_full(api: httpx.Client, seconds: float, tally: Episodes, tag: str) -> None:
    """Submit probes (and read) for `seconds`; count the answers and remember what was acknowledged."""
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += 1
        submit = api.post("/jobs", json=probe_body(), headers={"Idempotency-Key": f"{tag}-{n}"})
        if submit.status_code == 201:
            tally.acked[f"{tag}-{n}"] = submit.json()["id"]
        for response in (submit, api.get("/jobs", params={"limit": 5})):
            tally.statuses_while_full[response.status_code] = tally.statuses_while_full.get(response.status_code,
                                                                                             0) + 1
            if response.status_code in (503, 507) and "Retry-After" not in response.headers:
                tally.retry_after_missing += 1
        time.sleep(0.1)


def probe_body() -> dict[str, object]:
    return {"command": ["true"], "gpus": "0.5", "cpus": "0.1", "memory_mib": 64}


def recover(api: httpx.Client, tag: str, tally: Episodes, timeout_s: float = 30) -> float:
    """Seconds until a submission is acknowledged again (probes every 50 ms, ignoring Retry-After)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(httpx.TransportError):
            response = api.post("/jobs", json=probe_body(), headers={"Idempotency-Key": tag})
            if response.status_code == 201:
                tally.acked[tag] = response.json()["id"]
                return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"no write succeeded within {timeout_s} s of freeing the disk")


def episode(cluster: Cluster, number: int, tally: Episodes) -> None:
    assert cluster.server is not None
    ballast = cluster.server.data_dir / "ballast"
    fill(ballast)
    probe_while_full(cluster.api, HOLD_S, tally, f"full{number}")
    ballast.unlink()
    tally.recover_s.append(recover(cluster.api, f"recovered{number}", tally))


def test_t6_disk_full_answers_507_loses_nothing_and_recovers(tmp_path: Path):
    if shutil.which("mount") is None:
        pytest.skip("T6 needs `mount` to make a small filesystem")
    root = tmp_path / "t6"
    with small_disk(root / "cp") as kind:
        work = [Submission(f"t6-{i:03d}", {"command": [JOB_PYTHON, "-c", "import time; time.sleep(0.3)"],
                                           "gpus": "1", "cpus": "0.1", "memory_mib": 64}) for i in range(60)]
        tally = Episodes()
        with Cluster(root, env=dict(SCALED)) as cluster:
            for name in ("a", "b"):
                cluster.start_agent(name)
            cluster.wait_ready(["a", "b"])
            assert cluster.server is not None
            client = Submitter(cluster.url, cluster.server.token, work, pace_s=0.15)
            client.allow(len(work))
            client.start()
            for number in range(EPISODES):
                time.sleep(1.0)
                episode(cluster, number, tally)
            client.join(timeout=120)
            assert client.error is None and not client.is_alive(), (client.error, len(client.acked))
            wait_for(lambda: all(cluster.job(j)["state"] in TERMINAL for j in client.acked.values()), 60,
                     "every acknowledged job to end")
            probes = cluster.api.get("/jobs", params={"limit": 500}).json()["items"]
        verdict(cluster, client, tally, kind, len(probes))


def verdict(cluster: Cluster, client: Submitter, tally: Episodes, kind: str, stored: int) -> None:
    url = cluster.db_url
    keys = jobs_per_key(url)
    lost = [k for k, job_id in {**client.acked, **tally.acked}.items() if keys.get(k) != [job_id]]
    violations = run_checks(url)
    integrity = "ok" if integrity_ok(url) else "FAILED"
    full_answers = tally.statuses_while_full.get(507, 0) + tally.statuses_while_full.get(503, 0)
    statuses = {**dict(client.statuses), **{f"probe{k}": v for k, v in tally.statuses_while_full.items()}}
    line = figure(f"T6  disk_full_events={len(tally.recover_s)} lost={len(lost)} partial={len(violations)} "
                  f"recover_s={max(tally.recover_s):.2f} integrity={integrity}")
    assert cluster.server is not None
    refused_binds = cluster.server.log_path.read_text(errors="replace").count("binder: transaction refused")
    print(f"details (T6): {kind}, {stored} jobs, HTTP answers {statuses}, recover per episode {tally.recover_s}, "
          f"binds refused {refused_binds}")
    assert not lost and not violations and integrity == "ok", (line, lost, violations)
    assert full_answers > 0, f"the full disk was never noticed by the API: {tally.statuses_while_full}"
    assert 500 not in client.statuses and 500 not in tally.statuses_while_full, statuses
    assert tally.retry_after_missing == 0, "503/507 answers without Retry-After"
    assert max(tally.recover_s) <= 10, line
    # GPUs are freed in the cache only once their release is committed, so the scheduler never binds a GPU the
    # database still holds (the unique open-slot index would refuse the whole batch, cycle after cycle)
    assert refused_binds == 0, f"{refused_binds} bind transactions refused: cache and database disagreed"


# units: which failures are "storage full" ------------------------------------------------------------------------


class _PgDiskFull(Exception):
    sqlstate = "53100"


@pytest.mark.parametrize(("exc", "want"), [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (OSError(errno.EACCES, "Permission denied"), False),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full")), True),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked")), False),
    (OperationalError("INSERT", {}, _PgDiskFull("could not extend file")), True),
], ids=["enospc", "quota", "permission", "sqlite-full", "sqlite-locked", "postgres-53100"])
def test_storage_full(exc: BaseException, want: bool):
    assert storage_full(exc) is want
