"""T3 of RELIABILITY.md §3.1: stale, duplicate and out-of-order agent reports, against a real control plane (SQLite,
loopback) whose node is spoken for by hand on the mTLS agent channel (frames written here, as in S7).

1. T3.1 `Reports`, a Hypothesis RuleBasedStateMachine. Each sequence starts a new boot of the node's agent and
   submits one or two jobs to it; its rules then send task statuses, logs and heartbeats, duplicate a past frame
   0-5 times (verbatim: the same boot and seq; or renumbered, as an agent re-sends what was not acked), reorder two
   reports (their seqs, or their contents), replay frames of boots the node has left, report on a closed attempt
   (an attempt the control plane requeued, or an attempt number it never gave: the reports' side of a stale
   epoch), and reconnect, with the same boot or a new one that survived with some of its workloads. After every
   step: `run_checks` is empty, every allocation is where the model says (the control plane applies a frame of the
   current boot with a fresh seq, once, and answers a task status about a closed attempt `Rejected` 409), nothing
   released is open again nor released twice, attempts only grow, a node that claims a closed attempt runs is told
   to stop it before its claim is answered, and a duplicate changes nothing billing reads (allocations, jobs,
   finished ledger entries). PR tier: PR_SEQUENCES sequences; GPUPOOL_SOAK=1: SOAK_SEQUENCES, or as many as fit in
   SOAK_BUDGET_S (the figure says how many ran).
2. T3.2 `test_t3_2_a_stale_view_after_a_requeue_gets_a_stop_and_never_resurrects`: the node goes silent, is
   declared lost, its job requeued; it comes back saying the job runs: stopped within one heartbeat, its reports
   about that attempt refused (409), the attempt stays closed; a launch that waited for the node is never sent.
3. T3.3 `test_t3_3_a_new_boot_closes_what_it_does_not_run_at_once`: a new boot id closes the node's allocations it does
   not report, reason node_rebooted, within 1 s (no wait for the lost grace); those it reports stay.
4. T3.5 `test_late_or_stale_launch_orders_start_nothing`: launch orders delivered past their expiry or from an
   older epoch, in Hypothesis-chosen order among fresh ones, to the agent's real order handling and process
   runtime: refused, 0 started (the fixed cases are in tests/agent/test_orders.py and test_workloads.py; S7 has an
   expired order through a real agent).

One figure line per session: `T3  sequences=… inv_viol=0 dup_reports_applied=0 reboot_close_s=… late_orders_started=0`
(printed by whichever xdist worker finishes the last part, see Tally).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import ssl
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_cluster import SCALED, Cluster, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select
from websockets.exceptions import InvalidMessage
from websockets.sync.client import ClientConnection, connect

from gpupool.agent.clock import ManualClock
from gpupool.agent.orders import EpochRecord
from gpupool.agent.outbox import Outbox
from gpupool.agent.runtime import ProcessRuntime
from gpupool.agent.workloads import Workloads
from gpupool.devtools.figures import figure, soak
from gpupool.devtools.hand_tls import HandTls, channel_url
from gpupool.protocol.agent import Launch, TaskStatus
from gpupool.protocol.signing import OrderSigner, OrderVerifier
from gpupool.server.check import run_checks
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Allocation, Job, LedgerEntry

H = 0.5
# The hand node never goes suspect or lost here; usage is metered every half second in one-second periods.
ENV = {"GPUPOOL_HEARTBEAT_S": str(H), "GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600",
       "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_KILL_GRACE_S": "1", "GPUPOOL_CYCLE_INTERVAL_S": "0.05",
       "GPUPOOL_LAUNCH_TTL_S": "30", "GPUPOOL_METERING_INTERVAL_S": "0.5", "GPUPOOL_METERING_PERIOD_S": "1"}
PR_SEQUENCES, SOAK_SEQUENCES, SOAK_BUDGET_S, BATCH = 25, 10_000, 600.0, 25
FINAL = ("exited", "failed", "fenced", "refused")


# the figure: one line per session, whichever xdist worker finishes the last part ----------------------------------


class Tally:
    """Each part of T3 leaves its numbers in a folder every xdist worker of the session shares; the one that leaves
    the last part prints the figure line, once (an O_EXCL file decides who)."""

    PARTS = ("machine", "reboot", "late_orders")

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def part(self, name: str, **numbers: Any) -> None:
        scratch = self.folder / f".{name}.{os.getpid()}"
        scratch.write_text(json.dumps(numbers))
        scratch.replace(self.folder / f"{name}.json")  # whole, for a worker reading it at the same moment
        found = {p.stem: json.loads(p.read_text()) for p in self.folder.glob("*.json")}
        if not all(part in found for part in self.PARTS):
            return
        try:
            os.close(os.open(self.folder / "printed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        m, r, late = found["machine"], found["reboot"], found["late_orders"]
        reboot_s = max(m["reboot_close_s"], r["reboot_close_s"])
        figure(f"T3  sequences={m['sequences']} steps={m['steps']} inv_viol={m['inv_viol']} "
               f"dup_reports_applied={m['dup_reports_applied']} (of {m['duplicates']} duplicates) "
               f"stale_reports_rejected={m['stale_rejected']} reboot_close_s={reboot_s:.3f} (bound 1) "
               f"late_orders_started={late['started']} (of {late['orders']})")


@pytest.fixture(scope="session")
def tally(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Tally:
    base = tmp_path_factory.getbasetemp()
    return Tally((base.parent if worker_id != "master" else base) / "t3-figures")


# the control plane and its hand-spoken node ----------------------------------------------------------------------


@dataclass
class HandNode:
    name: str
    node_id: str
    credential: str
    model: str
    tls: ssl.SSLContext


def hand_node(cp: Cluster, gpus: int = 2) -> HandNode:
    name = f"t3-{uuid.uuid4().hex[:8]}"
    model = name.replace("-", "")
    tls = HandTls()
    body = {"join_token": cp.join_token(), "name": name, "boot_id": "boot-0", "cpu_milli": 64_000,
            "memory_mib": 65_536, "csr": tls.csr(name),
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": model, "memory_mib": 16_384, "fake": True}
                     for i in range(gpus)]}
    response = httpx.post(f"{cp.url}/api/v1/agent/register", json=body, timeout=30)
    assert response.status_code == 200, response.text
    reply = response.json()
    return HandNode(name, reply["node_id"], reply["credential"], model, tls.context(reply))


class Link:
    """One channel connection of a hand node. Frames go out as written (the caller picks boot and seq); every order
    that comes in is kept in `orders`, every ack or rejection in `answers` (by seq).

    A handshake that gets no answer is tried again, twice at most, as a real agent re-dials (`retries` counts them,
    `open_s` is the time to open): on a loaded machine the listener's 10 s handshake limit can drop one, and what
    is under test here is what the control plane makes of reports, not its listener."""

    def __init__(self, url: str, node: HandNode) -> None:
        self._stack = contextlib.ExitStack()
        self.retries, began = 0, time.monotonic()
        while True:
            try:
                self.ws: ClientConnection = self._stack.enter_context(connect(
                    url, ssl=node.tls, proxy=None, max_size=None, open_timeout=30,
                    additional_headers={"Authorization": f"Bearer {node.credential}"}))
                break
            except (TimeoutError, InvalidMessage):
                if self.retries == 2:
                    raise
                self.retries += 1
        self.open_s = time.monotonic() - began
        self.orders: list[dict[str, Any]] = []
        self.answers: dict[int, dict[str, Any]] = {}

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def answer(self, seq: int, timeout_s: float = 30) -> dict[str, Any]:
        """The ack or rejection of frame `seq` (whatever comes first is kept)."""
        deadline = time.monotonic() + timeout_s
        while seq not in self.answers:
            self._recv(deadline)
        return self.answers.pop(seq)

    def drain(self, seconds: float = 0.0) -> None:
        """Take in every frame that has come, and those that come within `seconds`."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(TimeoutError):
            while True:
                self._recv(deadline)

    def _recv(self, deadline: float) -> None:
        got = dict(json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic()))))
        if got["type"] in ("ack", "rejected"):
            self.answers[got["seq"]] = got
        else:
            self.orders.append(got)

    def close(self) -> None:
        self._stack.close()


@dataclass
class World:
    cp: Cluster
    node: HandNode
    db: Database
    channel: str  # the channel's wss URL


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Cluster(tmp_path_factory.mktemp("t3"), env=dict(ENV)) as cp:
        db = Database(cp.db_url)
        yield World(cp, hand_node(cp), db, channel_url(cp.url))
        db.engine.dispose()
    assert cp.violations == []


@dataclass(frozen=True)
class AllocationRow:
    attempt: int
    state: str
    started_at: Any
    released_at: Any
    release_reason: str | None


def allocations(db: Database, job_ids: set[str]) -> dict[str, AllocationRow]:
    with db.session() as session:
        return {a.id: AllocationRow(a.attempt, a.state, a.started_at, a.released_at, a.release_reason)
                for a in session.scalars(select(Allocation).where(Allocation.job_id.in_(job_ids)))}


def jobs(db: Database, job_ids: set[str]) -> dict[str, tuple[str, int]]:
    with db.session() as session:
        return {j.id: (j.state, j.attempt) for j in session.scalars(select(Job).where(Job.id.in_(job_ids)))}


def billing_view(db: Database, job_ids: set[str]) -> dict[str, dict[str, Any]]:
    """What billing reads about some jobs: their allocations (with exit codes), the jobs the scheduler is not about
    to move (it may place a pending one any moment), and the ledger of allocations released and metered to the end
    (metering extends the others as time passes)."""
    with db.session() as session:
        rows = list(session.scalars(select(Allocation).where(Allocation.job_id.in_(job_ids))))
        done = {a.id for a in rows if a.released_at is not None and a.metered_until is not None
                and a.metered_until >= a.released_at}
        ledger = sorted((e.allocation_id, e.source_key, e.gpu_milli_seconds, e.cost_micro_cents)
                        for e in session.scalars(select(LedgerEntry).where(LedgerEntry.allocation_id.in_(done))))
        allocation_view = {a.id: (a.attempt, a.state, a.started_at, a.released_at, a.release_reason, a.exit_code)
                           for a in rows}
    return {"allocations": allocation_view,
            "jobs": {j: v for j, v in jobs(db, job_ids).items() if v[0] != "pending"},
            "ledger": {a: [e for e in ledger if e[0] == a] for a in done}}


def changed(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between two billing views, on what both hold (work placed meanwhile is new, not changed)."""
    out = []
    for part in ("allocations", "jobs", "ledger"):
        old, new = before[part], after[part]
        out += [f"{part} {key}: {old[key]} -> {new[key]}" for key in sorted(old.keys() & new.keys())
                if old[key] != new[key]]
    return out


def open_allocations(db: Database, node_id: str) -> dict[str, int]:
    """allocation -> attempt of every allocation of `node_id` not released yet."""
    with db.session() as session:
        return {a.id: a.attempt for a in session.scalars(select(Allocation).where(
            Allocation.node_id == node_id, Allocation.released_at.is_(None)))}


# T3.1: the state machine -----------------------------------------------------------------------------------------


@dataclass
class Grant:
    """An allocation as the model sees it: `open` and `running` are the control plane's record as predicted (open:
    not released; running: a "started" applied), `held` whether the node's agent runs, or believes it runs, it."""

    id: str
    attempt: int
    job_id: str
    open: bool = True
    running: bool = False
    held: bool = True
    log_end: int = 0


@dataclass
class Stats:
    sequences: int = 0
    steps: int = 0
    duplicates: int = 0
    dup_applied: int = 0
    stale_rejected: int = 0
    reboot_close_s: float = 0.0
    open_retries: int = 0  # channel handshakes that got no answer in time and were tried again
    open_max_s: float = 0.0
    violations: list[str] = field(default_factory=list)


class Reports(RuleBasedStateMachine):
    """See the module docstring. `world` and `stats` are set on the class before a run."""

    world: World
    stats: Stats

    def __init__(self) -> None:
        super().__init__()
        self.link: Link | None = None
        self.boot, self.retired = uuid.uuid4().hex, []  # type: str, list[str]
        self.seqs = itertools.count()
        self.high = -1  # the highest seq of the current boot the control plane applied
        self.sent: list[dict[str, Any]] = []  # every frame sent, of every boot
        self.applied: set[tuple[str, int]] = set()  # (boot, seq) of the frames the control plane applied
        self.grants: dict[str, Grant] = {}
        self.job_ids: set[str] = set()
        self.released: dict[str, Any] = {}  # allocation -> released_at, once seen released
        self.attempts: dict[str, int] = {}

    # plumbing ---------------------------------------------------------------------------------------------------

    @property
    def cp(self) -> Cluster:
        return self.world.cp

    @property
    def db(self) -> Database:
        return self.world.db

    def _frame(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "boot_id": self.boot, "seq": next(self.seqs), **fields}

    def _send(self, frame: dict[str, Any]) -> None:
        """Send `frame`. One of the current boot is answered: check the answer against the model (and that each
        claim that a closed attempt runs got a stop order before it), then update the model."""
        assert self.link is not None
        fresh = frame["boot_id"] == self.boot and frame["seq"] > self.high
        claims = self._stale_claims(frame) if fresh else []
        self.link.send(frame)
        self.sent.append(frame)
        if frame["boot_id"] != self.boot:
            return  # a boot the node left: dropped, not even acked
        got = self.link.answer(frame["seq"])
        want = self._expect(frame) if fresh else "ack"  # a seen seq is acked again, never applied again
        assert got["type"] == want, (frame, got)
        if got["type"] == "rejected":
            assert got["code"] == 409, got
            self.stats.stale_rejected += 1
        stops = {(o["allocation_id"], o["attempt"]) for o in self.link.orders if o["type"] == "stop"}
        assert set(claims) <= stops, f"{claims} claimed to run closed attempts and were answered without a stop"
        if fresh:
            self.high = frame["seq"]
            self.applied.add((frame["boot_id"], frame["seq"]))
            self._apply(frame)
        self._take_orders()

    def _expect(self, frame: dict[str, Any]) -> str:
        if frame["type"] != "task_status":
            return "ack"
        grant = self.grants[frame["allocation_id"]]
        return "ack" if grant.open and frame["attempt"] == grant.attempt else "rejected"

    def _stale_claims(self, frame: dict[str, Any]) -> list[tuple[str, int]]:
        """(allocation, attempt) pairs that `frame` says run although that attempt is closed."""
        if frame["type"] == "task_status" and frame["state"] == "started":
            claimed = [(frame["allocation_id"], frame["attempt"])]
        elif frame["type"] == "hello":
            claimed = [(r["allocation_id"], r["attempt"]) for r in frame["running"]]
        else:
            return []
        return [(a, n) for a, n in claimed if not (self.grants[a].open and self.grants[a].attempt == n)]

    def _apply(self, frame: dict[str, Any]) -> None:
        """The model of what a fresh task status does (logs, heartbeats and a Hello of the same boot change no
        allocation; a new boot's Hello: see `reboot`)."""
        if frame["type"] != "task_status":
            return
        grant = self.grants[frame["allocation_id"]]
        if grant.open and frame["attempt"] == grant.attempt:
            grant.running = grant.running or frame["state"] == "started"
            grant.open = frame["state"] == "started"

    def _take_orders(self) -> bool:
        """Learn this sequence's allocations from their launch orders (a requeued job comes back as a new one)."""
        assert self.link is not None
        for order in self.link.orders:
            new = order["type"] == "launch" and order["job_id"] in self.job_ids
            if new and order["allocation_id"] not in self.grants:
                self.grants[order["allocation_id"]] = Grant(order["allocation_id"], order["attempt"], order["job_id"])
        self.link.orders = [o for o in self.link.orders if o["type"] == "stop"][-100:]
        return True

    def _hello(self, running: list[Grant], stale: list[Grant] | None = None) -> dict[str, Any]:
        return self._frame("hello", running=[{"allocation_id": g.id, "attempt": g.attempt, "state": "running"}
                                             for g in [*running, *(stale or [])]])

    def _open_link(self) -> None:
        """A new connection (the former one closed); its handshake retries are counted."""
        if self.link is not None:
            self.link.close()
        self.link = Link(self.world.channel, self.world.node)
        self.stats.open_retries += self.link.retries
        self.stats.open_max_s = max(self.stats.open_max_s, self.link.open_s)

    def _flush(self) -> None:
        """Everything sent before has been handled once a heartbeat sent after it is answered (a connection is
        served in order)."""
        self._send(self._frame("heartbeat", telemetry=[], idle_gpus=[]))

    def _grant(self, pick: int) -> Grant:
        return list(self.grants.values())[pick % len(self.grants)]

    # the sequence's start and end -------------------------------------------------------------------------------

    @initialize(count=st.integers(1, 2))
    def start(self, count: int) -> None:
        """A new boot of the node's agent connects; one or two jobs are placed on the node."""
        self._open_link()
        self._send(self._hello([]))
        for _ in range(count):
            self.job_ids.add(self.cp.submit(command=["sleep", "600"], gpus="1", gpu_models=[self.world.node.model]))
        assert self.link is not None
        wait_for(lambda: self.link.drain(0.05) or self._take_orders() and len(self.grants) >= count, 30,
                 "the jobs' launch orders")

    def teardown(self) -> None:
        """Cancel the sequence's jobs and end whatever still holds the node, so the next sequence finds it free."""
        try:
            if self.link is not None:
                for job_id in self.job_ids:
                    self.cp.api.post(f"/jobs/{job_id}/cancel")
                wait_for(self._end_open_allocations, 30, "the sequence's allocations to be released")
                self.link.close()
        finally:
            self.stats.sequences += 1

    def _end_open_allocations(self) -> bool:
        assert self.link is not None
        still = open_allocations(self.db, self.world.node.node_id)
        for allocation_id, attempt in still.items():
            self.link.send(self._frame("task_status", allocation_id=allocation_id, attempt=attempt, state="exited",
                                       exit_code=0))
        self.link.drain(0.05)
        return not still

    # rules ------------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 99), state=st.sampled_from(("started", "started", *FINAL)),
          exit_code=st.sampled_from((0, 0, 1)))
    def task_status(self, pick: int, state: str, exit_code: int) -> None:
        grant = self._grant(pick)
        self._send(self._frame("task_status", allocation_id=grant.id, attempt=grant.attempt, state=state,
                               exit_code=exit_code if state == "exited" else None))
        grant.held = grant.held and state == "started"

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 99), rewind=st.booleans())
    def log(self, pick: int, rewind: bool) -> None:
        grant = self._grant(pick)
        offset = 0 if rewind else grant.log_end
        self._send(self._frame("log", allocation_id=grant.id, attempt=grant.attempt, offset=offset, data="line\n"))
        grant.log_end = offset + 5

    @rule(usage=st.integers(0, 100), idle=st.booleans())
    def heartbeat(self, usage: int, idle: bool) -> None:
        """A heartbeat with the GPUs' usage, all of them idle or none."""
        uuids = [f"GPU-{self.world.node.name}-{i}" for i in range(2)]
        telemetry = [{"uuid": u, "utilization_pct": usage, "memory_used_mib": 10 * usage} for u in uuids]
        self._send(self._frame("heartbeat", telemetry=telemetry, idle_gpus=uuids if idle else []))

    @precondition(lambda self: self.sent)
    @rule(pick=st.integers(0, 999), times=st.integers(0, 5), verbatim=st.booleans())
    def duplicate(self, pick: int, times: int, verbatim: bool) -> None:
        """A past frame again, 0-5 times: verbatim (its boot and seq: a replay) or, if it was applied, renumbered into
        the current boot (an agent re-sending what it saw no ack for). Nothing billing reads may change."""
        candidates = self.sent if verbatim else [f for f in self.sent if (f["boot_id"], f["seq"]) in self.applied]
        if not candidates:
            return
        original = candidates[pick % len(candidates)]
        self._flush()
        before = billing_view(self.db, self.job_ids)
        for _ in range(times):
            self._send(dict(original) if verbatim else {**original, "boot_id": self.boot, "seq": next(self.seqs)})
            self.stats.duplicates += 1
        self._flush()
        changes = changed(before, billing_view(self.db, self.job_ids))
        self.stats.dup_applied += bool(changes)
        assert changes == [], f"duplicates of {original} changed what billing reads: {changes}"

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 99), states=st.sampled_from((("started", "exited"), ("started", "fenced"),
                                                            ("log", "log"), ("started", "log"), ("log", "failed"))),
          by_seq=st.booleans())
    def reorder(self, pick: int, states: tuple[str, str], by_seq: bool) -> None:
        """Two reports about one allocation, the later one first: by seq (the earlier seq, coming second, counts as
        seen: acked, not applied), or by content (the later content carries the earlier seq: both apply, in the
        order they came)."""
        grant = self._grant(pick)
        early, late = (self._report(grant, s) for s in states)
        if not by_seq:
            early["seq"], late["seq"] = late["seq"], early["seq"]
        self._send(late)
        self._send(early)
        grant.held = grant.held and not set(states) & set(FINAL)

    def _report(self, grant: Grant, state: str) -> dict[str, Any]:
        if state == "log":
            return self._frame("log", allocation_id=grant.id, attempt=grant.attempt, offset=0, data="again\n")
        return self._frame("task_status", allocation_id=grant.id, attempt=grant.attempt, state=state,
                           exit_code=0 if state == "exited" else None)

    @precondition(lambda self: self.retired)
    @rule(pick=st.integers(0, 999))
    def replay_old_boot(self, pick: int) -> None:
        """A frame of a boot the node has left, exactly as sent then: dropped, not even acked; nothing changes."""
        assert self.link is not None
        old = [f for f in self.sent if f["boot_id"] in self.retired]
        frame = old[pick % len(old)]
        before = billing_view(self.db, self.job_ids)
        self._send(dict(frame))
        self._flush()
        assert frame["seq"] not in self.link.answers, "a frame of a former boot was answered"
        assert changed(before, billing_view(self.db, self.job_ids)) == []

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 99), shift=st.sampled_from((-1, 1, 7)),
          state=st.sampled_from(("started", "exited", "fenced")))
    def stale_attempt(self, pick: int, shift: int, state: str) -> None:
        """A report about an attempt number the allocation does not have (the reports' side of a stale epoch:
        orders carry the epoch, reports the attempt): rejected 409, and stopped if it claims to run."""
        grant = self._grant(pick)
        attempt = max(0, grant.attempt + shift)
        attempt += attempt == grant.attempt
        self._send(self._frame("task_status", allocation_id=grant.id, attempt=attempt, state=state,
                               exit_code=0 if state == "exited" else None))

    @rule(stale=st.booleans())
    def reconnect(self, stale: bool) -> None:
        """The same boot connects again and says what it runs, possibly also attempts the control plane has closed
        (a stale view, T3.2: each is ordered to stop before the Hello is acked)."""
        self._open_link()
        held = [g for g in self.grants.values() if g.held and g.open]
        self._send(self._hello(held, [g for g in self.grants.values() if not g.open] if stale else []))

    @rule(keep=st.lists(st.booleans(), min_size=4, max_size=4))
    def reboot(self, keep: list[bool]) -> None:
        """A new boot connects, having re-adopted the workloads `keep` picks: every allocation it does not report
        that had started is closed at once, reason node_rebooted (T3.3), before its Hello is acked; those that had
        not started get their launch again (the agent will run them)."""
        self.retired.append(self.boot)
        self.boot, self.high, self.seqs = uuid.uuid4().hex, -1, itertools.count()
        self._open_link()
        grants = list(self.grants.values())
        held = [g for i, g in enumerate(grants) if g.held and g.open and keep[i % 4]]
        doomed = [g for g in grants if g.open and g.running and g not in held]
        started = time.monotonic()
        self._send(self._hello(held))
        took = time.monotonic() - started
        rows = allocations(self.db, self.job_ids)
        for grant in doomed:
            assert (rows[grant.id].state, rows[grant.id].release_reason) == ("released", "node_rebooted"), grant
            grant.open = False
        for grant in grants:
            grant.held = grant in held or (grant.open and not grant.running)
        if doomed:
            self.stats.reboot_close_s = max(self.stats.reboot_close_s, took)
            assert took <= 1.0, f"the new boot's closing took {took:.3f} s"

    # invariants -------------------------------------------------------------------------------------------------

    @invariant()
    def control_plane_agrees(self) -> None:
        if self.link is None:
            return
        self.stats.steps += 1
        problems = run_checks(self.cp.db_url)
        rows = allocations(self.db, self.job_ids)
        for grant in self.grants.values():
            row, want = rows[grant.id], ("running" if grant.running else "starting") if grant.open else "released"
            if row.state != want:
                problems.append(f"allocation {grant.id} is {row.state}, the model says {want}")
        for allocation_id, released_at in self.released.items():
            if rows[allocation_id].released_at != released_at:
                problems.append(f"allocation {allocation_id} released at {released_at} is now {rows[allocation_id]}")
        self.released.update({a: r.released_at for a, r in rows.items() if r.released_at is not None})
        for job_id, (_, attempt) in jobs(self.db, self.job_ids).items():
            if attempt < self.attempts.get(job_id, 0):
                problems.append(f"job {job_id} went back from attempt {self.attempts[job_id]} to {attempt}")
            self.attempts[job_id] = attempt
        self.stats.violations += problems
        assert problems == [], problems


def run_machine(world: World, stats: Stats, sequences: int) -> None:
    Reports.world, Reports.stats = world, stats
    run_state_machine_as_test(Reports, settings=settings(
        max_examples=sequences, stateful_step_count=15, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_t3_1_stale_duplicate_and_out_of_order_reports(world: World, tally: Tally) -> None:
    stats = Stats()
    target, budget = (SOAK_SEQUENCES, SOAK_BUDGET_S) if soak() else (PR_SEQUENCES, float("inf"))
    started = time.monotonic()
    try:
        while stats.sequences < target and time.monotonic() - started < budget:
            run_machine(world, stats, min(BATCH, target - stats.sequences))
    finally:
        for line in stats.violations[:20]:  # a flaky failure hides them behind Hypothesis' own error
            print(f"t3.1 invariant violation: {line}")
        print(f"t3.1 channel handshakes: {stats.open_retries} retried, slowest {stats.open_max_s:.2f} s")
        tally.part("machine", sequences=stats.sequences, steps=stats.steps, inv_viol=len(stats.violations),
                   dup_reports_applied=stats.dup_applied, duplicates=stats.duplicates,
                   stale_rejected=stats.stale_rejected, reboot_close_s=stats.reboot_close_s)
    assert stats.violations == [] and stats.dup_applied == 0


# T3.2 and T3.3 ------------------------------------------------------------------------------------------------------


class HandAgent:
    """A hand node's agent in one boot: numbered frames on a Link, answered in order."""

    def __init__(self, channel: str, node: HandNode, boot: str | None = None) -> None:
        self.link, self.boot, self.seqs = Link(channel, node), boot or uuid.uuid4().hex, itertools.count()

    def say(self, kind: str, **fields: Any) -> dict[str, Any]:
        seq = next(self.seqs)
        self.link.send({"type": kind, "boot_id": self.boot, "seq": seq, **fields})
        return self.link.answer(seq)

    def hello(self, *grants: tuple[str, int]) -> dict[str, Any]:
        return self.say("hello", running=[{"allocation_id": a, "attempt": n, "state": "running"} for a, n in grants])

    def launch(self, timeout_s: float = 30) -> dict[str, Any]:
        def first() -> dict[str, Any] | None:
            self.link.drain(0.05)
            found = next((o for o in self.link.orders if o["type"] == "launch"), None)
            if found is not None:
                self.link.orders.remove(found)
            return found
        return dict(wait_for(first, timeout_s, "a launch order"))

    def stops(self) -> set[tuple[str, int]]:
        return {(o["allocation_id"], o["attempt"]) for o in self.link.orders if o["type"] == "stop"}


def started(agent: HandAgent, cp: Cluster, model: str) -> tuple[str, dict[str, Any]]:
    """A job placed on the agent's node and reported started there: (job id, its launch order)."""
    job_id = cp.submit(command=["sleep", "600"], gpus="1", gpu_models=[model])
    order = agent.launch()
    assert agent.say("task_status", allocation_id=order["allocation_id"], attempt=order["attempt"],
                     state="started")["type"] == "ack"
    return job_id, order


def allocation_of(db: Database, allocation_id: str) -> AllocationRow:
    with db.session() as session:
        a = session.get(Allocation, allocation_id)
        assert a is not None
        return AllocationRow(a.attempt, a.state, a.started_at, a.released_at, a.release_reason)


def test_t3_3_a_new_boot_closes_what_it_does_not_run_at_once(world: World, tally: Tally) -> None:
    """Two jobs run on the node; its agent comes back as a new boot that re-adopted one of them: the other is
    closed (node_rebooted) and its job requeued before the Hello is acked, with no wait for the lost grace (an hour
    here); the re-adopted one runs on."""
    old = HandAgent(world.channel, world.node)
    old.hello()
    (kept_job, kept), (lost_job, lost) = (started(old, world.cp, world.node.model) for _ in range(2))
    old.link.close()
    new = HandAgent(world.channel, world.node)
    began = time.monotonic()
    assert new.hello((kept["allocation_id"], kept["attempt"]))["type"] == "ack"
    took = time.monotonic() - began
    closed, running = (allocation_of(world.db, o["allocation_id"]) for o in (lost, kept))
    assert (closed.state, closed.release_reason) == ("released", "node_rebooted")
    assert closed.started_at <= closed.released_at  # billed up to the node's last word at most, never before start
    assert running.state == "running" and running.released_at is None
    assert took <= 1.0
    requeued = world.cp.events(lost_job)
    assert any(e["kind"] == "requeued" and "rebooted" in e["message"] for e in requeued), requeued
    for job_id in (kept_job, lost_job):  # the requeued job may be placed here again: end everything
        world.cp.api.post(f"/jobs/{job_id}/cancel")
    wait_for(lambda: [new.say("task_status", allocation_id=a, attempt=n, state="exited", exit_code=0)
                      for a, n in open_allocations(world.db, world.node.node_id).items()] == [], 30,
             "the node's allocations to end")
    new.link.close()
    tally.part("reboot", reboot_close_s=took)


def test_t3_2_a_stale_view_after_a_requeue_gets_a_stop_and_never_resurrects(tmp_path: Path) -> None:
    """The node goes silent past the lost grace (scaled G 3 s): lost, its job requeued. It comes back, same boot,
    saying the job's old attempt runs: the control plane orders it stopped before acking (within one heartbeat),
    answers its reports about that attempt 409, and the attempt stays closed. A second job placed on the node while
    it was silent (its launch waiting for the node's return) is requeued with it, and that launch never comes."""
    with Cluster(tmp_path / "cp", env={**SCALED, "GPUPOOL_LAUNCH_TTL_S": "30"}) as cp:
        db, node = Database(cp.db_url), hand_node(cp, gpus=2)
        channel = channel_url(cp.url)
        agent = HandAgent(channel, node)
        agent.hello()
        job_id, order = started(agent, cp, node.model)
        grant = {"allocation_id": order["allocation_id"], "attempt": order["attempt"]}
        agent.link.close()  # silent from here
        waiting = cp.submit(command=["sleep", "600"], gpus="1", gpu_models=[node.model])
        cp.wait_job(waiting, states=["scheduled"], timeout_s=10)  # placed before the node turned suspect
        wait_for(lambda: cp.nodes()[node.name]["state"] == "lost", 30, "the silent node to be declared lost")
        assert allocation_of(db, grant["allocation_id"]).release_reason == "lost"
        agent.link = Link(channel, node)
        began = time.monotonic()
        assert agent.hello((grant["allocation_id"], grant["attempt"]))["type"] == "ack"
        stop_s = time.monotonic() - began
        assert (grant["allocation_id"], grant["attempt"]) in agent.stops()  # it came before the ack
        for state in ("started", "exited", "fenced"):
            answer = agent.say("task_status", **grant, state=state, exit_code=0 if state == "exited" else None)
            assert (answer["type"], answer["code"]) == ("rejected", 409), answer
        row = allocation_of(db, grant["allocation_id"])
        assert (row.state, row.release_reason) == ("released", "lost")
        job = cp.job(job_id)
        assert job["attempt"] >= 2 or job["state"] == "pending", job
        assert [a for a in job["allocations"] if a["attempt"] == grant["attempt"] and a["state"] != "released"] == []
        assert stop_s <= float(SCALED["GPUPOOL_HEARTBEAT_S"]), f"the stop came {stop_s:.3f} s after the Hello"
        for job in (job_id, waiting):
            cp.api.post(f"/jobs/{job}/cancel")
        agent.link.drain(1.0)
        launches = [o for o in agent.link.orders if o["type"] == "launch"]
        assert [o for o in launches if o["job_id"] == waiting and o["attempt"] == 1] == []  # dropped when lost
        for launch in launches:  # later attempts, placed here again
            agent.say("task_status", allocation_id=launch["allocation_id"], attempt=launch["attempt"], state="exited",
                      exit_code=0)
        agent.link.close()
        db.engine.dispose()
    assert cp.violations == []


# T3.5: late and stale launch orders -------------------------------------------------------------------------------

NOW = 1_700_000_000.0
SIGNER = OrderSigner.generate()
ORDERS = st.lists(st.tuples(st.integers(-2, 2), st.booleans()), min_size=1, max_size=8)


def test_late_or_stale_launch_orders_start_nothing(tmp_path: Path, tally: Tally) -> None:
    """T3.5: signed launch orders for this node, each from an epoch around the highest the agent has seen (−2..+2)
    and fresh or past its expiry, in Hypothesis-chosen sequences, through the agent's own order handling
    (`Workloads`: signature, node, epoch record, expiry) onto a real process runtime: every late or stale one is
    refused and starts nothing; every other one starts."""
    counts = {"orders": 0, "started": 0}
    runs = itertools.count()

    @settings(max_examples=200 if soak() else 25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(plan=ORDERS)
    def deliver(plan: list[tuple[int, bool]]) -> None:
        folder = tmp_path / f"run{next(runs)}"
        runtime, outbox = ProcessRuntime(folder / "workloads", base_env={"PATH": os.environ.get("PATH", "")}), \
            Outbox("boot")
        epochs = EpochRecord(folder / "epoch")
        epochs.observe(5)
        node = Workloads(runtime, outbox, wall_clock=ManualClock(NOW), epochs=epochs, gpu_uuids=(), node_id="n1",
                         verifier=OrderVerifier(SIGNER.public_key))
        doomed = set()
        for i, (shift, late) in enumerate(plan):
            epoch = max(0, epochs.highest + shift)
            order = Launch(allocation_id=f"a{i}", attempt=1, job_id="j", task_index=0, command=["true"],
                           epoch=epoch, expires_at=NOW - 1 if late else NOW + 60)
            if late or epoch < epochs.highest:
                doomed.add(f"a{i}")
            node.on_launch(SIGNER.seal(order, "n1"))
        statuses = {f.allocation_id: f.state for f in outbox.take() if isinstance(f, TaskStatus)}
        ran = {handle.allocation_id for handle in runtime.adopt()}
        counts["orders"] += len(doomed)
        counts["started"] += len(doomed & ran)
        assert ran & doomed == set() and {a for a, s in statuses.items() if s == "refused"} == doomed
        assert ran == set(statuses) - doomed

    try:
        deliver()
    finally:
        tally.part("late_orders", **counts)
