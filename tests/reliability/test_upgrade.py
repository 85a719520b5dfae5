"""An upgrade of the only control plane with a schema migration loses no running work (issue 42, docs:
docs/operating/high-availability.md "Upgrades").

With jobs running on real agents (fake GPUs), the control plane is stopped, its database is taken back one schema
revision (the state a control plane of the previous version left: STAND-IN for installing the previous release, the
schema being all that a version leaves in the database), and the control plane is started again: it applies the
migration at start, the agents reconnect, and every job runs on to its end in its first attempt, billed without a gap.
Figure: `T13 upgrade_with_migration from=… to=… jobs=… restarted_attempts=0 requeued=0 inv_viol=0 down_s=…`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker
from alembic import command

from gpupool.devtools.figures import figure
from gpupool.devtools.harness import restart_server, stable_port, stop_server
from gpupool.server.check import run_checks
from gpupool.server.db import migrating

pytestmark = pytest.mark.slow

ENV = {**SCALED, "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_LOST_AFTER_S": "31.5"}
JOBS, WORK_S = 4, 25.0


def _revision(url: str) -> str:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(MigrationContext.configure(connection).get_current_revision())
    finally:
        engine.dispose()


def test_t13_a_restart_that_migrates_the_schema_restarts_no_attempt(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", env=dict(ENV), port=stable_port()) as cluster:
        cluster.start_agent("n0")
        cluster.start_agent("n1")
        cluster.wait_ready(["n0", "n1"])
        boxes = {}
        for i in range(JOBS):
            box = cluster.drop_box(f"job{i}")
            boxes[cluster.submit(command=marker_command(box, WORK_S), gpus="1")] = box
        for job_id in boxes:
            cluster.wait_job(job_id, ["running"], timeout_s=60)
        assert cluster.server is not None
        head = _revision(cluster.db_url)
        down_at = time.monotonic()
        stop_server(cluster.server)
        command.downgrade(migrating.alembic_config(cluster.db_url), "-1")
        previous = _revision(cluster.db_url)
        assert previous != head
        cluster.server = restart_server(cluster.server)
        cluster._client = cluster.server.client()
        down_s = time.monotonic() - down_at
        assert _revision(cluster.db_url) == head
        finished = [cluster.wait_job(job_id, timeout_s=WORK_S + 60) for job_id in boxes]
        restarted = sum(j["attempt"] != 1 or (boxes[j["id"]] / "attempt-2").exists() for j in finished)
        requeued = sum(e["kind"] == "requeued" for j in finished for e in cluster.events(j["id"]))
        violations = run_checks(cluster.db_url)
        figure(f"T13 upgrade_with_migration from={previous} to={head} jobs={JOBS} restarted_attempts={restarted} "
               f"requeued={requeued} inv_viol={len(violations)} down_s={down_s:.1f}")
        assert restarted == 0 and requeued == 0 and violations == []
        assert all(j["state"] == "succeeded" for j in finished)
        assert all((m := read_marker(box / "attempt-1")) is not None and m.done for box in boxes.values())


def test_a_database_migrated_by_a_newer_gpupool_is_refused_with_its_reason(tmp_path: Path) -> None:
    """An older control plane started on a database a newer one migrated (a rolling upgrade gone backwards) refuses
    in one line instead of touching it."""
    import subprocess
    import sys

    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'gpupool.db'}"
    migrating.upgrade(url)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    engine.dispose()
    done = subprocess.run([sys.executable, "-m", "gpupool.server", "--data-dir", str(tmp_path), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "9999_from_the_future, which this gpupool does not know" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
