"""Real processes for tests and benchmarks: a throwaway PostgreSQL server (started as the postgres user
when running as root) and control-plane subprocesses on loopback. Never used by the product itself."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


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
        subprocess.run([*self.as_user, str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", "gpupool", name], check=True, capture_output=True)
        return f"postgresql+psycopg://gpupool@127.0.0.1:{self.port}/{name}"


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
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(root / "data"), "-l", str(root / "log"), "-w",
                    "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off "
                          "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
                    "start"], check=True, capture_output=True)
    try:
        yield Postgres(port, root, as_user, binaries)
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w",
                        "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Server:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen[bytes]

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=f"{self.url}/api/v1", timeout=30,
                            headers={"Authorization": f"Bearer {token or self.token}"})


def start_server(data_dir: Path, database_url: str | None = None, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "gpupool.cli.main", "server", "--data-dir", str(data_dir), "--port", str(port)]
    if database_url:
        cmd += ["--database-url", database_url]
    log = open(data_dir.parent / f"server-{port}.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode}: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).json().get("status") == "ok":
                return Server(url, (data_dir / "admin.token").read_text().strip(), data_dir, process)
        except (httpx.HTTPError, ValueError, FileNotFoundError):
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("server did not become ready")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
