"""Real processes for tests and benchmarks: a throwaway PostgreSQL server (started as the postgres user
when running as root) and control-plane subprocesses on loopback. Never used by the product itself."""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy (returned) or `timeout_s` passes (AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@dataclass
class Postgres:
    port: int
    root: Path
    as_user: list[str]
    bin: Path

    def create_database(self, name: str) -> str:
        """Create database `name`. Parallel tests create databases at the same moment, and CREATE DATABASE
        refuses while another session copies the same template, so a failure is retried a few times. An
        attempt can fail after the server created the database (the client's answer lost on a loaded
        machine); `name` is this caller's alone, so a retry that finds it existing has it."""
        command = [*self.as_user, str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                   "gpupool", name]
        errors = []
        for attempt in range(5):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode == 0 or (attempt and "already exists" in done.stderr):
                return f"postgresql+psycopg://gpupool@127.0.0.1:{self.port}/{name}"
            errors.append(done.stderr.strip())
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"createdb {name} failed: {' | '.join(errors)}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (a database outage): `fast` disconnects every client at once, `immediate` crashes."""
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", mode, "-w",
                        "stop"], check=True, capture_output=True)

    def start(self) -> None:
        """Start the stopped server again, on the same port and data."""
        _pg_start(self.as_user, self.bin, self.root, self.port)


def _pg_start(as_user: list[str], binaries: Path, root: Path, port: int) -> None:
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(root / "data"), "-l", str(root / "log"), "-w",
                    "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off "
                          "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
                    "start"], check=True, capture_output=True)


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A fresh PostgreSQL cluster under /tmp on a free loopback port; removed on exit."""
    binaries = pg_bin()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed")
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(root / "data"), "-U", "gpupool", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True)
    _pg_start(as_user, binaries, root, port)
    try:
        yield Postgres(port, root, as_user, binaries)
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w",
                        "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Server:
    """A control-plane subprocess. `port`, `database_url` and `env` are what it was started with, so that
    `restart_server` can bring up its successor on the same data, address and settings."""

    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    port: int = 0
    database_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=f"{self.url}/api/v1", timeout=30,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    @property
    def log_path(self) -> Path:
        return server_log(self.data_dir, self.port)


def server_log(data_dir: Path, port: int) -> Path:
    """Where the control plane on `port` with `data_dir` logs (every incarnation appends to it)."""
    return data_dir.parent / f"server-{port}.log"


def stable_port() -> int:
    """A free loopback port below the kernel's ephemeral range, so that no outgoing connection takes it while
    a killed control plane is restarted on it."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


# Tests and benchmarks drive the API far harder than a person or a script would (hundreds of requests a second
# from one token, bursts of refused tokens from loopback): the API guard's limits are lifted for them, unless the
# caller's environment or `env` sets them (the S5/S6 tests set low ones). The agent channel listens on a free port
# (agents learn it from /readyz at each connect), as API port + 1 may be another test's.
TEST_LIMITS = {"GPUPOOL_RATE_LIMIT_PER_S": "1000000", "GPUPOOL_RATE_LIMIT_BURST": "1000000",
               "GPUPOOL_AUTH_FAILURES_PER_MIN": "1000000", "GPUPOOL_MAX_PENDING_JOBS_PER_ORG": "1000000",
               "GPUPOOL_AGENT_PORT": "0"}


def spawn_server(data_dir: Path, port: int, database_url: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a control plane on `port` without waiting for it (its output goes to `server_log`). It is what
    `gpupool server` execs, started directly: the CLI's own start would add most of a second to every test's."""
    cmd = [sys.executable, "-m", "gpupool.server", "--data-dir", str(data_dir), "--port", str(port)]
    if database_url:
        cmd += ["--database-url", database_url]
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(server_log(data_dir, port), "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**TEST_LIMITS, **os.environ, **(env or {})})


def wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 90,
               poll_s: float = 0.2) -> None:
    """Poll `url`/readyz until it says ok; RuntimeError (with the log's tail) if the process exits or time runs out
    (the process is then killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode}: {log_path.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if httpx.get(f"{url}/readyz", timeout=1).json().get("status") == "ok":
                return
        time.sleep(poll_s)
    process.kill()
    raise RuntimeError("server did not become ready")


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port` (Linux /proc: the socket's inode in
    /proc/net/tcp among the process's open files)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    def target(fd: str) -> str:
        with contextlib.suppress(OSError):  # a file closed since the listing
            return os.readlink(f"/proc/{pid}/fd/{fd}")
        return ""

    with contextlib.suppress(OSError):
        return any(target(fd) in inodes for fd in os.listdir(f"/proc/{pid}/fd"))
    return False


def start_server(data_dir: Path, database_url: str | None = None, env: dict[str, str] | None = None,
                 port: int | None = None, poll_s: float = 0.2) -> Server:
    """Start a control plane (on a free port below the ephemeral range unless `port` is given) and wait until it
    is ready.

    Another test can take the chosen port between the probe and the bind: then the other server answers /readyz
    while this one fails to bind. Whose answer came is told by who holds the listening socket; on another's, this
    start is let finish its start-up (bootstrap, admin token), fail to bind and exit, and is retried on another
    port."""
    for _ in range(5):
        chosen = port or stable_port()
        process = spawn_server(data_dir, chosen, database_url, env)
        url = f"http://127.0.0.1:{chosen}"
        try:
            wait_ready(url, process, server_log(data_dir, chosen), poll_s=poll_s)
        except RuntimeError as error:
            if port is not None or "address already in use" not in str(error).lower():
                raise
            continue
        if port is not None or listens(process.pid, chosen):
            token = (data_dir / "admin.token").read_text().strip()
            return Server(url, token, data_dir, process, chosen, database_url, dict(env or {}))
        with contextlib.suppress(subprocess.TimeoutExpired):  # it fails to bind once its start-up is done
            process.wait(timeout=60)
        kill_server(Server(url, "", data_dir, process))
    raise RuntimeError(f"no control plane started in {data_dir}: every free port was taken before it bound")


#: the files a standby control plane must hold, copied from the pool's first one (docs: High availability)
POOL_KEY_FILES = ("master.key", "ca.key", "ca.crt", "order-signing.key", "order-signing.pub")


def copy_pool_keys(source: Path, data_dir: Path) -> None:
    """Provision `data_dir` for a standby as the HA docs say: the pool's keys from the first control plane's data dir
    `source`, each 0600 (the .pub and .crt 0644) in a 0700 folder."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in POOL_KEY_FILES:
        target = data_dir / name
        shutil.copyfile(source / name, target)
        target.chmod(0o644 if name.endswith((".pub", ".crt")) else 0o600)


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


def kill_server(server: Server) -> int | None:
    """kill -9 the control plane (if it still runs) and reap it; returns its exit status (-9 when killed)."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGKILL)
    return server.process.wait(timeout=20)


def restart_server(server: Server, env: dict[str, str] | None = None, poll_s: float = 0.05) -> Server:
    """Start the successor of a stopped or killed `server`: same data dir, port and database; `env` replaces the
    environment it was started with (None: the same). Waits until it is ready."""
    return start_server(server.data_dir, server.database_url, server.env if env is None else env, server.port,
                        poll_s)
