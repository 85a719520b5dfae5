"""Control-plane throughput: submissions per second and submit -> placed latency (p50, p99) with 250 fake
nodes x 8 GPUs registered, on SQLite and on PostgreSQL (issue 5's targets: >= 200 submits/s on PostgreSQL,
p99 < 1 s). Nodes are registered through the real agent endpoint with fake GPU inventories but no agent
processes (liveness timeouts are raised so they stay schedulable); placement is measured from each job's
"submitted" and "scheduled" events, both stamped by the control plane."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx

from gpupool.core.metrics import nearest_rank
from gpupool.devtools.harness import Server, pg_bin, postgres_server, start_server, stop_server
from gpupool.protocol.agent import Registration
from gpupool.protocol.devices import GpuInfo

NODES, GPUS, CLIENTS, SECONDS = 250, 8, 8, 10.0
SLOW_LIVENESS = {"GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "6000", "GPUPOOL_FENCE_S": "60"}


def register_nodes(server: Server, nodes: int = NODES, gpus_per_node: int = GPUS) -> None:
    """Join `nodes` fake A100 nodes through the agent endpoint (no agent processes)."""
    with server.client() as c, httpx.Client(base_url=server.url, timeout=30) as raw:
        for n in range(nodes):
            token = c.post("/join-tokens", json={"ttl_s": 600}).json()["token"]
            gpus = [GpuInfo(index=i, uuid=f"GPU-bench-{n}-{i}", model="A100", memory_mib=81920, fake=True)
                    for i in range(gpus_per_node)]
            reg = Registration(join_token=token, name=f"bench-{n:03d}", boot_id="b", cpu_milli=128_000,
                               memory_mib=1 << 20, gpus=gpus)
            raw.post("/api/v1/agent/register", content=reg.model_dump_json(),
                     headers={"content-type": "application/json"}).raise_for_status()


def _submit_for(server: Server, seconds: float, counts: list[int]) -> None:
    deadline = time.monotonic() + seconds
    with server.client() as c:
        while time.monotonic() < deadline:
            c.post("/jobs", json={"command": ["sleep", "3600"], "gpus": "0.1", "cpus": "0.1", "memory_mib": 64},
                   headers={"Idempotency-Key": uuid.uuid4().hex}).raise_for_status()
            counts.append(1)


def _latencies(server: Server) -> list[float]:
    out = []
    with server.client() as c:
        cursor = None
        while True:
            page = c.get("/jobs", params={"limit": 500, **({"cursor": cursor} if cursor else {})}).json()
            for job in page["items"]:
                events = {e["kind"]: datetime.fromisoformat(e["at"]) for e in c.get(f"/jobs/{job['id']}/events").json()}
                if "scheduled" in events:
                    out.append((events["scheduled"] - events["submitted"]).total_seconds())
            cursor = page["next_cursor"]
            if cursor is None:
                return out


@contextlib.contextmanager
def _database(backend: str) -> Iterator[str | None]:
    if backend == "sqlite":
        yield None
    else:
        with postgres_server() as pg:
            yield pg.create_database("bench")


def measure(backend: str) -> dict[str, float]:
    with _database(backend) as url, tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "data", url, env=SLOW_LIVENESS)
        try:
            register_nodes(server)
            time.sleep(1)
            counts: list[int] = []
            threads = [threading.Thread(target=_submit_for, args=(server, SECONDS, counts)) for _ in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            time.sleep(2)
            latency = _latencies(server)
        finally:
            stop_server(server)
    return {"submits_per_s": len(counts) / SECONDS, "jobs": len(counts), "placed": len(latency),
            "p50_s": nearest_rank(latency, 50) if latency else float("nan"),
            "p99_s": nearest_rank(latency, 99) if latency else float("nan"),
            "mean_s": statistics.fmean(latency) if latency else float("nan")}


def run() -> dict[str, dict[str, float]]:
    results = {}
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and pg_bin() is None:
            print("postgres: not installed, skipped")
            continue
        r = results[backend] = measure(backend)
        print(f"{backend:>8}: {r['submits_per_s']:6.1f} submits/s ({CLIENTS} clients, {SECONDS:.0f} s, "
              f"{r['jobs']} jobs); "
              f"submit -> placed p50 {1000 * r['p50_s']:.0f} ms, p99 {1000 * r['p99_s']:.0f} ms "
              f"({r['placed']} placed on {NODES} nodes x {GPUS} GPUs)")
    print("command: make bench BENCH_ARGS='--suite control-plane'")
    return results
