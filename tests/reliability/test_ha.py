"""T5: control-plane high availability on PostgreSQL (RELIABILITY.md §3.1, §2.1 I9).

Two control planes share one PostgreSQL database (active/passive, the scheduler lease with a fencing epoch, timings
scaled: lease 1.5 s, renew deadline 1.0 s, retry 0.2 s). Rounds alternate the two Jepsen nemeses on the leader:

* kill -9, then a restart (the restarted process is the new passive);
* SIGSTOP for 2x the lease, then SIGCONT: the "zombie leader". Both processes arm the failpoints
  `scheduler.before_bind=sleep(400)` and `binder.after_allocation_insert=sleep(200)`, and a burst of submissions
  lands just before the stop, so the leader is most often paused with a cycle's decisions in hand (resumed, it
  binds them with its old epoch and the fence refuses them) or inside its fenced transaction (the database ends
  the paused session after lease_s idle, so the takeover is not blocked, and the zombie's commit fails; paused in
  the middle of a statement, where that timeout does not apply, the takeover ends its session after 2 leases).

Jobs are submitted throughout (each with an Idempotency-Key, to whichever control plane answers) onto nodes that
registered without an agent (so allocations stay "starting"). Reported: takeover time (fault -> a new epoch in the
lease row), writes the deposed leaders attempted (their "fenced write refused" log lines, and their transactions
the database ended) and writes accepted from a deposed leader (an allocation created under epoch e after epoch
e+1 was seen: must be 0), every acknowledged job placed exactly once, and the invariant checker at the end.
GPUPOOL_SOAK=1 runs 50 rounds, the PR tier 4. Also, in process: the fence itself against a real PostgreSQL
(stale epoch refused; a takeover waits for a fenced transaction; a leader paused inside one is cut off).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from gpupool.devtools.figures import figure, soak
from gpupool.devtools.harness import Postgres, Server, copy_pool_keys, free_port, server_log, start_server
from gpupool.server.check import run_checks
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import Allocation, Job, Lease
from gpupool.server.scheduler.lease import LEASE_NAME, Fenced, SchedulerLease

pytestmark = pytest.mark.slow

LEASE_S, RENEW_S, RETRY_S = 1.5, 1.0, 0.2
ROUNDS = 50 if soak() else 4
BURST = 4  # jobs submitted just before each fault
ENV = {"GPUPOOL_LEASE_S": str(LEASE_S), "GPUPOOL_LEASE_RENEW_S": str(RENEW_S), "GPUPOOL_LEASE_RETRY_S": str(RETRY_S),
       "GPUPOOL_CYCLE_INTERVAL_S": "0.1", "GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600",
       "GPUPOOL_FAILPOINTS": "scheduler.before_bind=sleep(400),binder.after_allocation_insert=sleep(200)"}
NODES, GPUS = 8, 8
JOB = {"command": ["true"], "gpus": "0.1", "cpus": "0.01", "memory_mib": 16}


# the lease row, watched -------------------------------------------------------------------------------------


class EpochWatch(threading.Thread):
    """Polls the lease row every 20 ms; `seen[epoch]` is the wall time that epoch was first seen, `holders[epoch]`
    its holder."""

    def __init__(self, url: str) -> None:
        super().__init__(name="epoch-watch", daemon=True)
        self.db = Database(url)
        self.seen: dict[int, float] = {}
        self.holders: dict[int, str] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            try:
                with self.db.session() as session:
                    row = session.execute(select(Lease.epoch, Lease.holder).where(Lease.name == LEASE_NAME)).first()
            except Exception:  # noqa: BLE001 - keep watching
                continue
            if row is not None and row.epoch not in self.seen:
                self.seen[row.epoch], self.holders[row.epoch] = time.time(), row.holder

    @property
    def epoch(self) -> int:
        return max(self.seen, default=0)

    def wait_beyond(self, epoch: int, timeout_s: float) -> float:
        """The wall time a higher epoch than `epoch` was first seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [t for e, t in self.seen.items() if e > epoch]
            if later:
                return min(later)
            time.sleep(0.01)
        raise AssertionError(f"no takeover within {timeout_s} s (epoch still {self.epoch})")

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.db.engine.dispose()


# two control planes ----------------------------------------------------------------------------------------


@dataclass
class Pair:
    """Two control-plane processes on one database: `servers[name]`; a restart keeps the name and data dir."""

    root: Path
    url: str
    servers: dict[str, Server] = field(default_factory=dict)
    token: str = ""

    def start(self, name: str) -> Server:
        data = self.root / name
        data.mkdir(parents=True, exist_ok=True)
        env = dict(ENV)
        if self.token:  # the database exists: share the operator token, and provision the pool's keys (HA docs)
            (data / "admin.token").write_text(self.token + "\n")
            if not (data / "master.key").exists():
                copy_pool_keys(self.root / "a", data)
        server = start_server(data, self.url, env=env)
        self.token = self.token or server.token
        self.servers[name] = server
        return server

    def leader(self, watch: EpochWatch) -> str:
        """The name of the process holding the lease now (its pid is in the holder id)."""
        holder = watch.holders[watch.epoch]
        pid = int(holder.split(":")[1])
        return next(n for n, s in self.servers.items() if s.process.pid == pid)

    def other(self, name: str) -> str:
        return next(n for n in self.servers if n != name)

    def stacks(self) -> str:
        """Every live process's thread stacks (SIGUSR1 makes a control plane log them) and its log's tail."""
        out = []
        for server in self.servers.values():
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        for name, server in self.servers.items():
            log = server_log(server.data_dir, server.port).read_text(errors="replace").splitlines()[-150:]
            state = "running" if server.process.poll() is None else f"exited {server.process.returncode}"
            out.append(f"--- {name} (pid {server.process.pid}, {state}) ---\n" + "\n".join(log))
        return "\n".join(out)

    def stop_all(self) -> None:
        for server in self.servers.values():
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
                server.process.terminate()
        for server in self.servers.values():
            try:
                server.process.wait(20)
            except Exception:  # noqa: BLE001
                server.process.kill()


class Submitter(threading.Thread):
    """Submits `JOB` when allowed, each with its own Idempotency-Key, to whichever control plane answers (1 s
    timeout, then the other one), retrying until a 201; `acked` maps key -> job id."""

    def __init__(self, pair: Pair) -> None:
        super().__init__(name="ha-submitter", daemon=True)
        self.pair = pair
        self.acked: dict[str, str] = {}
        self.allowed = 0
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._done = False

    def allow(self, count: int) -> None:
        with self._cond:
            self.allowed += count
            self._cond.notify_all()

    def wait_acked(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()
        self.join(120)
        assert not self.is_alive(), "the submitter did not finish"

    def run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self.allowed > len(self.acked) or self._done)
                    if self.allowed <= len(self.acked):
                        return
                self._submit(uuid.uuid4().hex)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _submit(self, key: str) -> None:
        deadline = time.monotonic() + 60
        turn = 0
        while time.monotonic() < deadline:
            servers = list(self.pair.servers.values())
            server = servers[turn % len(servers)]
            turn += 1
            try:
                response = httpx.post(f"{server.url}/api/v1/jobs", json=JOB, timeout=1.0,
                                      headers={"Authorization": f"Bearer {self.pair.token}", "Idempotency-Key": key})
            except httpx.HTTPError:
                continue
            if response.status_code == 201:
                self.acked[key] = str(response.json()["id"])
                return
            if response.status_code < 500 and response.status_code != 429:
                raise AssertionError(f"submit: {response.status_code} {response.text}")
            time.sleep(0.1)
        raise AssertionError(f"submission {key} not acknowledged within 60 s")


def register_nodes(server: Server) -> None:
    """NODES nodes of GPUS fake GPUs, registered without an agent (no channel: allocations stay "starting")."""
    with server.client() as api:
        for i in range(NODES):
            token = api.post("/join-tokens", json={}).json()["token"]
            body = {"join_token": token, "name": f"ha-{i}", "boot_id": "boot", "cpu_milli": 64_000,
                    "memory_mib": 262_144, "gpus": [{"index": g, "uuid": f"GPU-ha-{i}-{g}", "model": "A100",
                                                     "memory_mib": 81_920, "fake": True} for g in range(GPUS)]}
            response = httpx.post(f"{server.url}/api/v1/agent/register", json=body, timeout=30)
            assert response.status_code == 200, response.text


# the rounds --------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    takeovers: list[float] = field(default_factory=list)
    kills: int = 0
    stops: int = 0


def one_round(index: int, pair: Pair, watch: EpochWatch, submitter: Submitter, tally: Tally,
              rng: random.Random) -> None:
    """Fault the leader (kill -9 on even rounds, SIGSTOP for 2x the lease on odd ones) and recover."""
    name = pair.leader(watch)
    epoch = watch.epoch
    submitter.allow(BURST)
    submitter.wait_acked(submitter.allowed)
    time.sleep(rng.uniform(0.1, 0.3))
    process = pair.servers[name].process
    faulted = time.time()
    if index % 2 == 0:
        process.kill()
        process.wait(10)
        tally.kills += 1
    else:
        process.send_signal(signal.SIGSTOP)
        tally.stops += 1
    try:
        tally.takeovers.append(watch.wait_beyond(epoch, timeout_s=30) - faulted)
    except AssertionError as missed:
        raise AssertionError(f"round {index}: {missed}\n{pair.stacks()}") from None
    if index % 2 == 0:
        pair.start(name)
    else:
        time.sleep(max(0.0, faulted + 2 * LEASE_S - time.time()))
        process.send_signal(signal.SIGCONT)
        time.sleep(0.5)  # the zombie wakes and tries its stale cycle


def placements(url: str, acked: dict[str, str]) -> tuple[list[str], dict[str, list[tuple[int, Any]]]]:
    """(acked jobs not placed exactly once, {job: [(leader_epoch, created_at)]} of every allocation)."""
    db = Database(url)
    try:
        with db.session() as session:
            jobs = {j.id: j for j in session.scalars(select(Job))}
            allocs: dict[str, list[tuple[int, Any]]] = {}
            for a in session.scalars(select(Allocation)):
                allocs.setdefault(a.job_id, []).append((a.leader_epoch, a.created_at))
    finally:
        db.engine.dispose()
    bad = [f"{job_id}: {jobs[job_id].state if job_id in jobs else 'missing'} attempt "
           f"{jobs[job_id].attempt if job_id in jobs else '-'} allocations {len(allocs.get(job_id, []))}"
           for job_id in acked.values()
           if job_id not in jobs or jobs[job_id].attempt != 1 or len(allocs.get(job_id, [])) != 1]
    return bad, allocs


def deposed_accepted(allocs: dict[str, list[tuple[int, Any]]], seen: dict[int, float]) -> list[str]:
    """Allocations written under epoch e after a later epoch was already in the lease row."""
    out = []
    for job_id, rows in allocs.items():
        for epoch, created in rows:
            later = [t for e, t in seen.items() if e > epoch]
            at = (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
            if later and at > min(later):
                out.append(f"job {job_id}: allocation of epoch {epoch} created {at - min(later):.3f} s after "
                           "the next epoch")
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def refused_lines(root: Path) -> int:
    """Writes of deposed leaders that did not land: refused by the fence, or cut off by the database."""
    logs = [p.read_text(errors="replace") for p in root.glob("server-*.log")]
    return sum(t.count("fenced write refused") + t.count("idle-in-transaction timeout") for t in logs)


@pytest.fixture
def pair(postgres: Postgres, tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path / "cp", postgres.create_database(f"ha{os.getpid()}_{free_port()}"))
    made.root.mkdir(parents=True)
    try:
        yield made
    finally:
        made.stop_all()


def test_t5_failover_rounds_place_every_job_once_and_fence_deposed_leaders(pair: Pair):
    rng = random.Random(5)
    first = pair.start("a")
    shutil.copy(first.data_dir / "admin.token", pair.root / "admin.token")
    pair.start("b")
    register_nodes(first)
    watch = EpochWatch(pair.url)
    watch.start()
    submitter = Submitter(pair)
    submitter.start()
    tally = Tally()
    try:
        watch.wait_beyond(0, timeout_s=30)
        for index in range(ROUNDS):
            one_round(index, pair, watch, submitter, tally, rng)
            assert submitter.error is None, submitter.error
        submitter.finish()
        assert submitter.error is None, submitter.error
        deadline = time.monotonic() + 30
        while (bad := placements(pair.url, submitter.acked)[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
        bad, allocs = placements(pair.url, submitter.acked)
        seen = dict(watch.seen)
    finally:
        watch.stop()
    pair.stop_all()
    accepted = deposed_accepted(allocs, seen)
    attempted = refused_lines(pair.root)
    violations = run_checks(pair.url)
    figure(f"T5  rounds={ROUNDS} kills={tally.kills} stops={tally.stops} jobs={len(submitter.acked)} "
           f"takeover_p50={sorted(tally.takeovers)[len(tally.takeovers) // 2]:.2f}s "
           f"takeover_p99={p99(tally.takeovers):.2f}s deposed_writes_attempted={attempted} "
           f"deposed_writes_accepted={len(accepted)} misplaced={len(bad)} inv_viol={len(violations)} (pg)")
    assert not bad, "acknowledged jobs not placed exactly once:\n" + "\n".join(bad[:20])
    assert not accepted, "\n".join(accepted)
    assert not violations, "\n".join(violations)
    assert p99(tally.takeovers) <= LEASE_S + RENEW_S + RETRY_S + 1.0, tally.takeovers


# the fence itself, in process ---------------------------------------------------------------------------------


@pytest.fixture
def lease_db(postgres: Postgres) -> Iterator[Database]:
    url = postgres.create_database(f"fence{os.getpid()}_{free_port()}")
    migrate(url)
    db = Database(url)
    yield db
    db.engine.dispose()


def leases(db: Database, tmp_path: Path, lease_s: float = 0.6) -> tuple[SchedulerLease, SchedulerLease]:
    return (SchedulerLease(db, tmp_path, "a", lease_s, lease_s * 2 / 3, 0.05),
            SchedulerLease(db, tmp_path, "b", lease_s, lease_s * 2 / 3, 0.05))


def test_fence_refuses_a_deposed_epoch_and_passes_the_current_one(lease_db: Database, tmp_path: Path):
    a, b = leases(lease_db, tmp_path)
    assert a.hold() and not b.hold()
    old = a.epoch
    time.sleep(0.7)  # a pauses past its lease
    assert not a.is_leader()
    assert b.hold() and b.epoch == old + 1
    with pytest.raises(Fenced), lease_db.session() as session:
        a.fence(session, old)
    with lease_db.session() as session:
        b.fence(session, b.epoch)
    assert (a.refused, b.refused) == (1, 0)
    assert not a.hold(), "the deposed leader must not win the lease back while b renews it"


def test_takeover_waits_for_a_fenced_transaction_to_end(lease_db: Database, tmp_path: Path):
    a, b = leases(lease_db, tmp_path)
    assert a.hold()
    fenced, last_write_at = threading.Event(), []

    def fenced_write() -> None:
        with lease_db.session() as session:
            a.fence(session, a.epoch)
            fenced.set()
            for _ in range(3):  # 1.2 s in all, past a's lease, never idle for lease_s at once
                time.sleep(0.4)
                session.execute(text("SELECT 1"))
            # stamped inside the transaction: after the commit, this thread may be scheduled only after b's
            # takeover has already been stamped, though the takeover did wait for the commit
            last_write_at.append(time.monotonic())

    writer = threading.Thread(target=fenced_write)
    writer.start()
    fenced.wait(5)
    time.sleep(0.7)  # a's lease has expired; its fenced transaction still runs
    assert b.hold(), "b takes over once a's transaction ends"
    took_over_at = time.monotonic()
    writer.join(5)
    assert last_write_at and last_write_at[0] <= took_over_at, "the takeover did not wait for the fenced write"
    assert b.epoch == a.epoch + 1


def test_a_leader_paused_inside_a_fenced_transaction_is_cut_off(lease_db: Database, tmp_path: Path):
    a, b = leases(lease_db, tmp_path, lease_s=0.5)
    assert a.hold()
    with pytest.raises(Exception) as caught, lease_db.session() as session:  # noqa: PT011 - the driver's error
        a.fence(session, a.epoch)
        time.sleep(1.2)  # paused, idle in transaction, past idle_in_transaction_session_timeout = lease_s
        assert b.hold(), "the takeover must not wait for the paused leader"
        session.execute(text("SELECT 1"))
    assert not isinstance(caught.value, AssertionError), caught.value
    assert b.epoch == a.epoch + 1


def test_a_leader_stuck_inside_a_statement_is_cut_off(lease_db: Database, tmp_path: Path):
    """The idle-in-transaction timeout does not end a session in the middle of a statement (a leader paused halfway
    through a pipelined batch, or blocked on a lock); the takeover ends it once it has waited CUT_OFF_LEASES leases."""
    a, b = leases(lease_db, tmp_path, lease_s=0.5)
    assert a.hold()
    fenced, failures = threading.Event(), []

    def stuck_write() -> None:
        try:
            with lease_db.session() as session:
                a.fence(session, a.epoch)
                fenced.set()
                session.execute(text("SELECT pg_sleep(60)"))
        except Exception as exc:  # noqa: BLE001 - the driver's error for a terminated session
            failures.append(exc)

    writer = threading.Thread(target=stuck_write)
    writer.start()
    assert fenced.wait(5)
    time.sleep(0.6)  # a's lease has expired; its session is inside a statement, holding the lease row
    started = time.monotonic()
    while not b.hold() and time.monotonic() - started < 10:
        time.sleep(0.05)
    waited = time.monotonic() - started
    writer.join(10)
    assert b.is_leader() and b.epoch == a.epoch + 1, "the takeover must not wait for the stuck leader"
    assert waited < 5, f"took {waited:.1f} s"
    assert failures and not writer.is_alive(), "the stuck leader's transaction must have been ended"
