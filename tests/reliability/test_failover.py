"""Failover with running work (issue 42; RELIABILITY.md T5 extended): two control planes on one PostgreSQL, the
standby provisioned as docs/operating/high-availability.md says (the pool's keys copied with copy_pool_keys), real
agents given both URLs (`--server A,B`) with fake GPUs, marker workloads (one file per attempt, a tick every 50 ms).

* T5f (failover): the leader is killed (SIGKILL) with jobs running and jobs pending: the standby takes over, no
  running attempt restarts, every pending job is placed within 30 s of the takeover, and the agents reconnect to the
  new leader without a restart of their own.
* T5s (split brain): the leader is paused (SIGSTOP) past its lease, the standby takes over, the old leader is resumed:
  no moment at which two attempts of one job run, the old leader admits no agent (it is a standby now) and the
  agents stay with the new leader.
* A standby whose keys are not the pool's refuses to lead and says why in /readyz.

Timings: leases scaled as T5 (lease 1.5 s, renew 1.0 s, retry 0.2 s), heartbeats as T2 (0.25 s), max_disconnect
30 s (production's 600 s scaled by 1/20).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from agent_cluster import SCALED, Cluster, marker_command, read_marker, wait_for
from test_ha import EpochWatch

from gpupool.devtools.figures import figure
from gpupool.devtools.harness import Postgres, Server, copy_pool_keys, kill_server, start_server, stop_server
from gpupool.protocol.agent import Registration
from gpupool.server.check import run_checks

pytestmark = pytest.mark.slow

ENV = {**SCALED, "GPUPOOL_LEASE_S": "1.5", "GPUPOOL_LEASE_RENEW_S": "1.0", "GPUPOOL_LEASE_RETRY_S": "0.2",
       "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_LOST_AFTER_S": "31.5"}
AGENTS = ("n0", "n1", "n2")
GPUS = "8xA100-80GB"
RUNNING, PENDING = 20, 100
TAKEOVER_PLACED_S = 30.0


@dataclass
class Pool:
    cluster: Cluster  # its server is the first control plane, A
    standby: Server  # B
    watch: EpochWatch

    @property
    def servers(self) -> str:
        return f"{self.cluster.url},{self.standby.url}"

    def client(self, server: Server) -> httpx.Client:
        return server.client(self.cluster.server.token if self.cluster.server else None)


@pytest.fixture
def pool(tmp_path: Path, postgres: Postgres) -> Iterator[Pool]:
    url = postgres.create_database(f"failover_{tmp_path.name[-40:].replace('-', '_').lower()}")
    with Cluster(tmp_path / "a", env=dict(ENV), database_url=url) as cluster:
        assert cluster.server is not None
        first = cluster.server
        data_b = tmp_path / "b" / "cp"
        copy_pool_keys(cluster.server.data_dir, data_b)
        (data_b / "admin.token").write_text(cluster.server.token + "\n")
        standby = start_server(data_b, url, env=dict(ENV))
        watch = EpochWatch(url)
        watch.start()
        pool = Pool(cluster, standby, watch)
        try:
            for name in AGENTS:
                cluster.start_agent(name, GPUS, server_url=pool.servers)
            cluster.wait_ready(list(AGENTS))
            yield pool
        finally:
            watch.stop()
            for server in (first, standby):  # the cluster stops whichever it talks to last; this stops both
                if server.process.poll() is None:
                    server.process.send_signal(signal.SIGCONT)
                    stop_server(server)
    assert cluster.violations == []


def _submit(pool: Pool, count: int, seconds: float, gpus: str, prefix: str) -> dict[str, Path]:
    jobs = {}
    for i in range(count):
        box = pool.cluster.drop_box(f"{prefix}{i}")
        jobs[pool.cluster.submit(command=marker_command(box, seconds), gpus=gpus, name=f"{prefix}{i}")] = box
    return jobs


def _switch_to(pool: Pool, server: Server) -> None:
    """Talk to `server` from now on (the cluster's API client)."""
    pool.cluster.server, pool.cluster._client = server, pool.client(server)


def _restarted(pool: Pool, jobs: dict[str, Path]) -> int:
    return sum(pool.cluster.job(j)["attempt"] > 1 or (box / "attempt-2").exists() for j, box in jobs.items())


def _agents_alive(pool: Pool) -> bool:
    return all(pool.cluster.agents[name].alive for name in AGENTS)


def test_t5_a_killed_leader_hands_running_work_over_untouched(pool: Pool) -> None:
    running = _submit(pool, RUNNING, 60, "0.5", "run")
    for job_id in running:
        pool.cluster.wait_job(job_id, ["running"], timeout_s=60)
    epoch = pool.watch.epoch
    leader = pool.cluster.server
    assert leader is not None
    killed_at = time.time()
    kill_server(leader)
    pending = _submit_to(pool, pool.standby, PENDING)  # the standby answers the API meanwhile
    taken_at = pool.watch.wait_beyond(epoch, 30)
    _switch_to(pool, pool.standby)
    placed = wait_for(lambda: _all_placed(pool, pending), TAKEOVER_PLACED_S + 30, "the pending jobs to be placed")
    placed_s = placed - taken_at
    wait_for(lambda: all(n["state"] == "ready" for n in pool.cluster.nodes().values()), 30, "the agents to be back")
    restarted = _restarted(pool, running)
    figure(f"T5f failover jobs_running={RUNNING} jobs_pending={PENDING} agents={len(AGENTS)} takeover_s="
           f"{taken_at - killed_at:.2f} restarted_attempts={restarted} pending_placed_after_takeover_s="
           f"{placed_s:.1f} (bound {TAKEOVER_PLACED_S:g}) agents_restarted={int(not _agents_alive(pool))} (pg)")
    assert restarted == 0 and _agents_alive(pool)
    assert placed_s <= TAKEOVER_PLACED_S
    for job_id in running:  # never requeued, still running
        assert not {e["kind"] for e in pool.cluster.events(job_id)} & {"requeued", "preempted"}
        assert pool.cluster.job(job_id)["state"] == "running"
    assert run_checks(pool.cluster.db_url) == []


def _submit_to(pool: Pool, server: Server, count: int) -> list[str]:
    """`count` small jobs submitted to `server` (retried while it answers 503 during the takeover)."""
    ids = []
    with pool.client(server) as client:
        for i in range(count):
            body = {"command": ["true"], "gpus": "0.1", "cpus": "0.01", "memory_mib": 16, "name": f"wait{i}"}
            response = wait_for(lambda b=body: (r := client.post("/jobs", json=b, headers={
                "Idempotency-Key": f"wait-{b['name']}"})).status_code == 201 and r, 30, "a submission")
            ids.append(response.json()["id"])
    return ids


def _all_placed(pool: Pool, jobs: list[str]) -> float | None:
    """The wall time once none of `jobs` is pending any more, else None."""
    states = [pool.cluster.job(j)["state"] for j in jobs]
    return time.time() if all(s not in ("pending", "pending_approval") for s in states) else None


def test_t5_a_paused_leader_comes_back_as_a_standby_and_nothing_runs_twice(pool: Pool) -> None:
    running = _submit(pool, 2 * len(AGENTS), 40, "1", "run")
    for job_id in running:
        pool.cluster.wait_job(job_id, ["running"], timeout_s=60)
    epoch, old = pool.watch.epoch, pool.cluster.server
    assert old is not None
    old.process.send_signal(signal.SIGSTOP)
    try:
        pool.watch.wait_beyond(epoch, 30)
        time.sleep(3 * float(ENV["GPUPOOL_LEASE_S"]))  # well past its lease
    finally:
        old.process.send_signal(signal.SIGCONT)
    _switch_to(pool, pool.standby)
    ready = wait_for(lambda: httpx.get(f"{old.url}/readyz", timeout=5).json(), 30, "the old leader to answer")
    wait_for(lambda: all(n["state"] == "ready" for n in pool.cluster.nodes().values()), 60,
             "the agents on the new leader")
    refused = _refuses_agents(old)
    for job_id in running:
        pool.cluster.wait_job(job_id, timeout_s=120)
    twice = sum(_overlap(box) > 0 for box in running.values())
    restarted = _restarted(pool, running)
    figure(f"T5s split_brain jobs={len(running)} agents={len(AGENTS)} paused_s={3 * float(ENV['GPUPOOL_LEASE_S']):g}+ "
           f"two_attempts_at_once={twice} restarted_attempts={restarted} old_leader_leads={ready.get('leader')} "
           f"old_leader_admits_agents={int(not refused)} (pg)")
    assert twice == 0 and restarted == 0
    assert ready.get("leader") is False and refused
    assert all(pool.cluster.job(j)["state"] == "succeeded" for j in running)
    assert run_checks(pool.cluster.db_url) == []


def _refuses_agents(server: Server) -> bool:
    """Whether `server` turns agents away: a standby's /readyz says it does not lead and a well-formed registration
    answers 503 (a channel handshake gets the same answer: AgentHub.admit)."""
    probe = Registration(join_token="probe.notreal", name="probe", boot_id="b", cpu_milli=1000, memory_mib=1024,
                         gpus=[])
    reply = httpx.post(f"{server.url}/api/v1/agent/register", content=probe.model_dump_json(),
                       headers={"content-type": "application/json"}, timeout=10)
    return httpx.get(f"{server.url}/readyz", timeout=5).json().get("leader") is False and reply.status_code == 503


def _overlap(box: Path) -> float:
    """Seconds attempts 1 and 2 of one job ran at once (0 when there is no attempt 2)."""
    first, second = read_marker(box / "attempt-1"), read_marker(box / "attempt-2")
    return 0.0 if first is None or second is None else max(0.0, first.last - second.first)


def test_a_standby_without_the_pool_keys_refuses_to_lead(pool: Pool, tmp_path: Path) -> None:
    data_c = tmp_path / "c" / "cp"
    data_c.mkdir(parents=True)
    assert pool.cluster.server is not None
    (data_c / "admin.token").write_text(pool.cluster.server.token + "\n")
    stranger = start_server(data_c, pool.cluster.db_url, env=dict(ENV))  # keys of its own
    try:
        ready = httpx.get(f"{stranger.url}/readyz", timeout=5).json()
        assert ready["leader"] is False
        assert "is not the pool's master key" in ready["refusal"] and "will not lead" in ready["refusal"]
        kill_server(pool.cluster.server)  # A gone: B (provisioned) takes over, never C
        epoch = pool.watch.epoch
        pool.watch.wait_beyond(epoch, 30)
        holder = pool.watch.holders[pool.watch.epoch]
        assert int(holder.split(":")[1]) == pool.standby.process.pid
    finally:
        stop_server(stranger)
