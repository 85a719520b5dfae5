"""A real control plane (SQLite) and real agent processes with fake GPUs, for end-to-end tests and the agent
benchmark (benchmarks/agents.py imports this module).

Agents run as `python -m gpupool.cli.main agent ...`, each with its own data dir under the cluster's root, optionally
behind a command prefix (e.g. `ip netns exec NS`). On exit the cluster stops its agents, SIGKILLs every workload
process they left behind (found through the runtime's state files, with pid-reuse checks; every process of a
transient uid too), and stops the server.

Jobs run as transient uids when the tests run as root (issue 41), and such a job can reach neither pytest's 0700
temporary folders nor a Python under /root. So each cluster has a `jobs_folder` anyone may pass through: the agents'
work roots live there, `drop_box` makes folders in it where jobs may leave files for the test, and job commands run
`JOB_PYTHON` (gpupool.devtools.jobdirs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpupool.agent.runtime.process import kill_uid_processes, load_handle
from gpupool.agent.runtime.procfs import host_boot_id, read_stat
from gpupool.devtools import jobdirs
from gpupool.devtools.harness import Server, start_server, stop_server, wait_for
from gpupool.server.check import run_checks

# RELIABILITY.md §2.2 scaled by 1/20 (lost grace G 3 s, self-fence F 2 s): F + grace < G as the server checks.
SCALED = {
    "GPUPOOL_HEARTBEAT_S": "0.25",
    "GPUPOOL_SUSPECT_AFTER_S": "0.75",
    "GPUPOOL_LOST_AFTER_S": "3",
    "GPUPOOL_MAX_DISCONNECT_S": "2",
    "GPUPOOL_KILL_GRACE_S": "0.5",
    "GPUPOOL_CYCLE_INTERVAL_S": "0.1",
    "GPUPOOL_METERING_INTERVAL_S": "0.5", "GPUPOOL_METERING_PERIOD_S": "1",
    "GPUPOOL_REQUEUE_RATE_PER_S": "2",  # lost nodes requeued: 0.1 node/s scaled by 20, burst 1
}
AGENT = [sys.executable, "-m", "gpupool.cli.main", "agent"]
JOB_PYTHON = jobdirs.job_python()
TERMINAL = ("succeeded", "failed", "cancelled", "denied")

# A workload that records its attempt: one file per attempt in DIR with "start PID T", "tick T" every 50 ms and
# "done T" after SECONDS; it prints what it saw first (the log tests read it).
MARKER_SCRIPT = """
import os, sys, time
os.umask(0)  # a restart of the attempt may run as another transient uid: it must be able to append
folder, seconds = sys.argv[1], float(sys.argv[2])
attempt = os.environ["GPUPOOL_ATTEMPT"]
if attempt == "1" and len(sys.argv) > 3:
    seconds = float(sys.argv[3])
print(f"attempt={attempt} pid={os.getpid()} CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)
end = time.time() + seconds
with open(os.path.join(folder, f"attempt-{attempt}"), "a") as out:
    out.write(f"start {os.getpid()} {time.time():.6f}\\n")
    out.flush()
    while time.time() < end:
        out.write(f"tick {time.time():.6f}\\n")
        out.flush()
        time.sleep(0.05)
    out.write(f"done {time.time():.6f}\\n")
"""


def marker_command(folder: Path, seconds: float, first_s: float | None = None) -> list[str]:
    """The marker workload writing into `folder` (a `Cluster.drop_box`), running `seconds`; attempt 1 runs
    `first_s` if given (one that must be stopped: it cannot end on its own first, however loaded the machine)."""
    return [JOB_PYTHON, "-c", MARKER_SCRIPT, str(folder), str(seconds), *([str(first_s)] if first_s else [])]


@dataclass
class Marker:
    """What one attempt's marker file says: its pid, first and last stamp, and whether it ran to the end."""

    pid: int
    first: float
    last: float
    done: bool


def read_marker(path: Path) -> Marker | None:
    if not path.exists():
        return None
    pid, stamps, done = 0, [], False
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue  # a line cut by SIGKILL
        if parts[0] == "start" and len(parts) == 3:
            pid = int(parts[1])
        done = done or parts[0] == "done"
        stamps.append(float(parts[-1]))
    return Marker(pid, min(stamps), max(stamps), done) if stamps else None


@dataclass
class Agent:
    name: str
    data_dir: Path
    log_path: Path
    fake_gpus: str
    process: subprocess.Popen[bytes] | None = None
    spawned_at: float = 0.0
    prefix: Sequence[str] = ()
    server_url: str = ""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 20) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def workload_pids(self) -> list[int]:
        """Process-group leaders of this node's workloads that still run (checked against pid reuse)."""
        boot, pids = host_boot_id(), []
        for state in (self.data_dir / "workloads").glob("*/state.json"):
            handle = load_handle(state)
            if handle is None or handle.host_boot_id != boot:
                continue
            stat = read_stat(handle.pgid)
            if stat is not None and stat.start_ticks == handle.start_ticks and not stat.is_dead:
                pids.append(handle.pgid)
        return pids

    def transient_uids(self) -> list[int]:
        """The transient uids of this boot that this node's workloads still record."""
        handles = [load_handle(state) for state in (self.data_dir / "workloads").glob("*/state.json")]
        return [h.uid for h in handles if h and h.uid_claim and h.uid is not None and h.host_boot_id == host_boot_id()]


@dataclass
class Cluster:
    """See the module docstring. Use as a context manager."""

    root: Path
    env: dict[str, str] = field(default_factory=lambda: dict(SCALED))
    server_host: str | None = None
    port: int | None = None  # None: any free port (set one to restart a killed control plane on it)
    database_url: str | None = None  # None: SQLite in the control plane's data dir
    server: Server | None = None
    agents: dict[str, Agent] = field(default_factory=dict)
    _client: httpx.Client | None = None
    _folders: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.jobs_folder = self._folders.enter_context(jobdirs.open_folder())
        env = dict(self.env)
        if self.server_host:
            env["GPUPOOL_HOST"] = self.server_host
        self.server = start_server(self.root / "cp", self.database_url, env=env, port=self.port)
        self._client = self.server.client()
        return self

    def __exit__(self, *exc: object) -> None:
        for agent in self.agents.values():
            if agent.alive:
                agent.signal(signal.SIGTERM)
        for agent in self.agents.values():
            if agent.process is not None:
                try:
                    agent.wait(10)
                except subprocess.TimeoutExpired:
                    agent.process.kill()
                    agent.wait()
            for pgid in agent.workload_pids():
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for uid in agent.transient_uids():  # what left the group (setsid, double fork)
                kill_uid_processes(uid)
        if self._client is not None:
            self._client.close()
        if self.server is not None:
            stop_server(self.server)
            # RELIABILITY.md §2.1: every run ends with the invariant checker (double allocation, ledger, ...)
            self.violations = run_checks(self.db_url)
        self._folders.close()

    # API ---------------------------------------------------------------------------------------

    @property
    def api(self) -> httpx.Client:
        assert self._client is not None
        return self._client

    @property
    def db_url(self) -> str:
        assert self.server is not None
        return self.database_url or f"sqlite:///{self.server.data_dir / 'gpupool.db'}"

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def drop_box(self, name: str) -> Path:
        """A folder in `jobs_folder` where jobs of any uid may leave files for the test (1777, like /tmp)."""
        return jobdirs.drop_box(self.jobs_folder / "boxes" / name)

    def join_token(self) -> str:
        response = self.api.post("/join-tokens", json={})
        assert response.status_code == 201, response.text
        return str(response.json()["token"])

    def nodes(self) -> dict[str, dict[str, Any]]:
        response = self.api.get("/nodes")
        assert response.status_code == 200, response.text
        return {n["name"]: n for n in response.json()}

    def submit(self, **body: Any) -> str:
        body.setdefault("cpus", "0.1")
        body.setdefault("memory_mib", 64)
        response = self.api.post("/jobs", json=body)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.api.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_job(self, job_id: str, states: Sequence[str] = TERMINAL, timeout_s: float = 30) -> dict[str, Any]:
        return dict(wait_for(lambda: (j := self.job(job_id))["state"] in states and j, timeout_s,
                             f"job {job_id} to be {'/'.join(states)} (now {self.job(job_id)['state']})"))

    def logs(self, job_id: str, task: int = 0) -> str:
        response = self.api.get(f"/jobs/{job_id}/logs", params={"task": task})
        assert response.status_code == 200, response.text
        return response.text

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.api.get(f"/jobs/{job_id}/events").json())

    # agents ------------------------------------------------------------------------------------

    def start_agent(self, name: str, fake_gpus: str = "2xA100-80GB", *, join: bool = True,
                    prefix: Sequence[str] = (), server_url: str | None = None, extra: Sequence[str] = ()) -> Agent:
        """Start (or restart, with `join=False`: the saved credential) the agent `name`, with `extra` arguments."""
        agent = self.agents.get(name)
        if agent is None:
            folder = self.root / "agents" / name
            folder.mkdir(parents=True, exist_ok=True)
            agent = Agent(name, folder / "data", folder / "agent.log", fake_gpus)
            self.agents[name] = agent
        assert not agent.alive, f"agent {name} already runs"
        agent.prefix, agent.server_url = tuple(prefix), server_url or self.url
        command = [*agent.prefix, *AGENT, "--server", agent.server_url, "--data-dir", str(agent.data_dir),
                   "--name", name, "--fake-gpus", fake_gpus, "--work-dir", str(self.jobs_folder / "work" / name)]
        if join:
            command += ["--join-token", self.join_token()]
        command += extra
        with open(agent.log_path, "ab") as log:
            agent.spawned_at = time.time()
            agent.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return agent

    def wait_ready(self, names: Sequence[str], timeout_s: float = 30) -> dict[str, dict[str, Any]]:
        """Wait until every named node is registered, "ready" and not cordoned; returns /nodes."""
        def ready() -> dict[str, dict[str, Any]] | None:
            for name in names:
                agent = self.agents.get(name)
                if agent is not None and agent.process is not None and agent.process.poll() is not None:
                    raise AssertionError(f"agent {name} exited {agent.process.returncode}:\n{agent.log()[-3000:]}")
            nodes = self.nodes()
            ok = all(n in nodes and nodes[n]["state"] == "ready" and not nodes[n]["cordoned"] for n in names)
            return nodes if ok else None
        return dict(wait_for(ready, timeout_s, f"nodes {', '.join(names)} to be ready"))

    def granted_uuids(self, allocation: dict[str, Any]) -> list[str]:
        """The GPU UUIDs of an allocation (the API lists GPU indexes; /nodes maps them to UUIDs)."""
        gpus = {g["index"]: g["uuid"] for g in self.nodes()[allocation["node"]]["gpus"]}
        return [gpus[g["index"]] for g in allocation["gpus"]]

    def allocated_milli(self) -> dict[str, int]:
        return {name: sum(g["allocated_milli"] for g in node["gpus"]) for name, node in self.nodes().items()}
