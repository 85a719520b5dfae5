"""Cancel is final, and a runtime limit counts from `scheduled` (issue 41, findings 3, 4 and 15), on a real control
plane (SQLite and PostgreSQL) whose node is spoken for by hand on the mTLS agent channel, so that the test decides
when (and whether) a placed job reports its start:

- a job whose node never starts it (an agent that cannot launch it) is ended at its runtime limit, counted from its
  scheduling, and its GPUs are free once the node answers the stop;
- cancelling a running job stops it and bills it to the stop, exactly; a start reported after the cancel (the agent
  launched the job before it read the stop) is answered with an immediate stop (no grace) and is never billed.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from gpupool.devtools.hand_tls import HandTls, open_channel
from gpupool.devtools.harness import Postgres, Server, free_port, start_server, stop_server, wait_for

#: the monitor (limits) runs every second; usage is metered every half second in one-second periods
ENV = {"GPUPOOL_CYCLE_INTERVAL_S": "0.1", "GPUPOOL_METERING_INTERVAL_S": "0.5", "GPUPOOL_METERING_PERIOD_S": "1",
       "GPUPOOL_KILL_GRACE_S": "5"}


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    url = None
    if request.param == "postgres":
        pg: Postgres = request.getfixturevalue("postgres")
        url = pg.create_database(f"cf_{free_port()}")
    srv = start_server(tmp_path / "data", url, env=ENV)
    yield srv
    stop_server(srv)


@contextmanager
def hand_node(server: Server, api: httpx.Client, gpus: int) -> Iterator[HandNode]:
    """A node registered with `gpus` GPUs, its channel open and its Hello acked."""
    name, tls = f"hand-{uuid.uuid4().hex[:8]}", HandTls()
    body = {"join_token": api.post("/join-tokens", json={}).json()["token"], "name": name, "boot_id": "boot",
            "cpu_milli": 64_000, "memory_mib": 65_536, "csr": tls.csr(name),
            "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "A100", "memory_mib": 40_960, "fake": True}
                     for i in range(gpus)]}
    reply = api.post("/agent/register", json=body)
    assert reply.status_code == 200, reply.text
    with open_channel(server, tls.context(reply.json()), reply.json()["credential"]) as ws:
        node = HandNode(name, ws)
        node.send("hello", running=[])
        yield node


class HandNode:
    """A node's end of its channel: frames go out with the next seq; orders that come in are kept in `orders`."""

    def __init__(self, name: str, ws: ClientConnection) -> None:
        self.name, self.ws, self.seqs = name, ws, itertools.count(1)
        self.orders: list[dict[str, Any]] = []
        self._acked: set[int] = set()

    def send(self, kind: str, **fields: Any) -> None:
        """Send a frame and wait for its ack (the control plane has applied it)."""
        seq = next(self.seqs)
        self.ws.send(json.dumps({"type": kind, "boot_id": "boot", "seq": seq, **fields}))
        deadline = time.monotonic() + 30
        while seq not in self._acked:
            self._recv(deadline)

    def report(self, launch: dict[str, Any], state: str, exit_code: int | None = None) -> None:
        self.send("task_status", allocation_id=launch["allocation_id"], attempt=launch["attempt"], state=state,
                  exit_code=exit_code)

    def order(self, kind: str, job_or_allocation: str, after: int = 0, timeout_s: float = 30) -> dict[str, Any]:
        """The first order of `kind` for a job (launch) or an allocation (stop) among those that came after the
        first `after` orders, waiting for it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for order in self.orders[after:]:
                if order["type"] == kind and job_or_allocation in (order.get("job_id"), order["allocation_id"]):
                    return order
            try:
                self._recv(deadline)
            except TimeoutError:
                raise AssertionError(f"no {kind} order for {job_or_allocation} in {timeout_s} s") from None

    def _recv(self, deadline: float) -> None:
        frame = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if frame["type"] == "ack":
            self._acked.add(frame["seq"])
        elif frame["type"] == "rejected":
            raise AssertionError(f"frame refused: {frame}")
        else:
            self.orders.append(frame)


def _submit(api: httpx.Client, **fields: Any) -> str:
    response = api.post("/jobs", json={"command": ["sleep", "600"], "gpus": "1", **fields})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_job_never_started_is_ended_at_its_runtime_limit_from_scheduled(server: Server) -> None:
    limit_s = 1
    with server.client() as api, hand_node(server, api, gpus=1) as node:
        job_id = _submit(api, runtime_limit_s=limit_s)
        launch = node.order("launch", job_id)  # ... which this node never manages to start
        stop = node.order("stop", launch["allocation_id"])  # main: the job stayed "scheduled", holding its GPU
        job = api.get(f"/jobs/{job_id}").json()
        assert (job["state"], job["reason"]["kind"]) == ("failed", "runtime_limit")
        events = {e["kind"]: _at(e["at"]) for e in api.get(f"/jobs/{job_id}/events").json()}
        assert events["timed_out"] - events["scheduled"] >= limit_s
        assert stop["reason"] == "runtime limit"
        node.report(launch, "refused")  # as an agent answers a stop of a workload it does not run
        allocation = api.get(f"/jobs/{job_id}").json()["allocations"][0]
        assert allocation["released_at"] is not None and allocation["started_at"] is None
        gpus = {n["name"]: n["gpus"] for n in api.get("/nodes").json()}[node.name]
        assert sum(g["allocated_milli"] for g in gpus) == 0


def test_cancel_bills_a_running_job_to_its_stop_and_never_a_start_reported_after_it(server: Server) -> None:
    with server.client() as api, hand_node(server, api, gpus=2) as node:
        running, late = _submit(api), _submit(api)
        launches = {job: node.order("launch", job) for job in (running, late)}
        node.report(launches[running], "started")
        assert api.get(f"/jobs/{running}").json()["state"] == "running"
        for job in (running, late):
            answer = api.post(f"/jobs/{job}/cancel")
            assert (answer.status_code, answer.json()["state"]) == (200, "cancelled")
        stops = {job: node.order("stop", launches[job]["allocation_id"]) for job in (running, late)}
        assert {stop["grace_s"] for stop in stops.values()} == {5}  # the cancel's stops: with the kill grace
        seen = len(node.orders)
        node.report(launches[late], "started")  # it launched before it read its stop
        again = node.order("stop", launches[late]["allocation_id"], after=seen)  # main: no answer but the ack
        assert again["grace_s"] == 0
        for job in (running, late):
            node.report(launches[job], "exited", exit_code=143)
        allocations = {job: api.get(f"/jobs/{job}").json()["allocations"][0] for job in (running, late)}
        assert allocations[late]["started_at"] is None and allocations[late]["released_at"] is not None
        ran_s = _at(allocations[running]["released_at"]) - _at(allocations[running]["started_at"])

        def usage() -> dict[str, float] | None:
            rows = {r["key"]: r["gpu_hours"] * 3600 for r in api.get("/usage", params={"by": "job"}).json()}
            return rows if running in rows and abs(rows[running] - ran_s) < 0.004 else None  # metered to its end

        billed = wait_for(usage, 30, f"job {running} billed for its {ran_s:.3f} s, from its start to its stop")
        assert late not in billed
        for job in (running, late):
            kinds = [e["kind"] for e in api.get(f"/jobs/{job}/events").json()]
            assert kinds[-1] == "cancelled" and api.get(f"/jobs/{job}").json()["state"] == "cancelled", kinds
