"""`gpupool server`, `gpupool agent` and `gpupool up` (all-in-one: a control plane on SQLite, one local
agent, and the dashboard when it exists, as child processes of this command)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import typer

from gpupool.cli.client import save_config
from gpupool.cli.render import console, error


def server(data_dir: Path = typer.Option(Path("gpupool-data"), help="where the database and logs live"),
           host: str | None = typer.Option(None, help="bind address, default $GPUPOOL_HOST or 127.0.0.1 (keep "
                                                       "loopback unless behind TLS)"),
           port: int | None = typer.Option(None, min=1, max=65535, help="default $GPUPOOL_PORT or 8181"),
           database_url: str | None = typer.Option(None, help="postgresql+psycopg://... (default: SQLite in data dir)"),
           profile: str | None = typer.Option(None, help="scheduling profile, default $GPUPOOL_PROFILE or default"),
           kubeconfig: str | None = typer.Option(None, help="also schedule this Kubernetes cluster's pods whose "
                                                            "schedulerName is gpupool (a kubeconfig file, or "
                                                            "in-cluster)"),
           log_level: str = typer.Option("warning")) -> None:
    """Run the control plane (API, scheduler, agent channel). Unset options leave the GPUPOOL_* variables in force."""
    args = [sys.executable, "-m", "gpupool.server", "--data-dir", str(data_dir), "--log-level", log_level]
    for flag, value in (("--host", host), ("--port", port), ("--profile", profile), ("--database-url", database_url),
                        ("--kubeconfig", kubeconfig)):
        if value:
            args += [flag, str(value)]
    os.execv(sys.executable, args)


def agent(server_url: str = typer.Option(..., "--server", help="control plane URL; several, comma-separated, for a "
                                                           "pool with standbys (whichever leads is used)"),
          join_token: str | None = typer.Option(None, envvar="GPUPOOL_JOIN_TOKEN",
                                                help="single-use join token (first start only); given here it shows "
                                                     "in `ps`: prefer the variable or --join-token-file"),
          join_token_file: Path | None = typer.Option(None, help="read the join token from this file (keep it 0600)"),
          data_dir: Path = typer.Option(Path("gpupool-agent"), help="credential, workload state and logs"),
          name: str | None = typer.Option(None, help="node name (default: host name)"),
          fake_gpus: str | None = typer.Option(None, help="declare FAKE GPUs, e.g. 8xH100-80GB (no real GPU)"),
          cp_key_hash: str | None = typer.Option(None, help="sha256:<hex> of the control plane's order key "
                                                            "(line 2 of its DATA_DIR/order-signing.pub)"),
          ca_hash: str | None = typer.Option(None, help="sha256:<hex> of the control plane's agent CA key (printed "
                                                        "by `gpupool join-token create`); refuse to join another"),
          run_jobs_as: str = typer.Option("dynamic-uid", help="dynamic-uid (a transient uid per job), local-user "
                                                              "(the account named as the job's gpupool user) or "
                                                              "root; an agent not running as root runs jobs as "
                                                              "itself"),
          job_uid_range: str = typer.Option("61184-65519", help="the transient uids of dynamic-uid, FIRST-LAST"),
          work_dir: Path | None = typer.Option(None, help="where jobs' own work folders go (default: DATA_DIR-work)")
          ) -> None:
    """Run a node agent: discovers GPUs, dials out to the control plane (mTLS), runs granted work."""
    from gpupool.agent.main import EXIT_CONFIG, read_join_token, run_agent

    try:
        token = read_join_token(join_token, join_token_file)
    except ValueError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_CONFIG) from None
    raise typer.Exit(run_agent(server_url, token, data_dir, name or os.uname().nodename, fake_gpus,
                               cp_key_hash=cp_key_hash, ca_hash=ca_hash, run_jobs_as=run_jobs_as,
                               job_uid_range=job_uid_range, work_dir=work_dir))


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, since: int, timeout_s: float = 60) -> None:
    """Wait for the control plane at `url` to be ready; RuntimeError if it exits first, with the last `error:` line
    it wrote to `log` after byte `since` (what went wrong, in its words)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the control plane exited with code {proc.returncode}{_last_error(log, since)}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the control plane did not become ready within 60 s")


def _last_error(log: Path, since: int) -> str:
    """": " and the last line starting with "error: " in `log` after byte `since`, or ""."""
    with log.open("rb") as lines:
        lines.seek(since)
        errors = [line for line in lines.read().decode(errors="replace").splitlines() if line.startswith("error: ")]
    return f": {errors[-1].removeprefix('error: ')}" if errors else ""


def up(data_dir: Path = typer.Option(Path("gpupool-data"), help="database, logs, admin token (made 0700)"),
       port: int = typer.Option(8181, min=1, max=65535),
       fake_gpus: str | None = typer.Option(None, help="FAKE GPUs for the local agent, e.g. 2xA100-80GB"),
       work_dir: Path | None = typer.Option(None, help="the local agent's job work folders (default: "
                                                       "DATA_DIR-work, outside DATA_DIR, which jobs cannot enter; "
                                                       "/var/lib/gpupool/work/... when others cannot pass a folder "
                                                       "above it)")
       ) -> None:
    """All-in-one: control plane on SQLite + one local agent. Ctrl-C stops both."""
    from gpupool.agent.main import default_work_root
    for private in (data_dir, data_dir / "logs"):  # the service user's alone: keys, tokens, database, logs
        private.mkdir(parents=True, exist_ok=True, mode=0o700)
        private.chmod(0o700)
    url = f"http://127.0.0.1:{port}"
    exe = [sys.executable, "-m", "gpupool.cli.main"]
    logs = data_dir / "logs"
    server_log = logs / "server.log"
    since = server_log.stat().st_size if server_log.exists() else 0
    server_proc = subprocess.Popen([*exe, "server", "--data-dir", str(data_dir), "--port", str(port)],
                                   stdout=open(server_log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    children = [server_proc]
    join_file = data_dir / "agent-join.token"
    try:
        _wait_healthy(url, server_proc, server_log, since)
        token = (data_dir / "admin.token").read_text().strip()
        agent_args = [*exe, "agent", "--server", url, "--data-dir", str(data_dir / "agent"), "--name", "local",
                      "--work-dir", str(work_dir or default_work_root(data_dir, switches=os.geteuid() == 0))]
        if not (data_dir / "agent" / "node.json").exists():
            join = httpx.post(f"{url}/api/v1/join-tokens", json={"ttl_s": 600},
                              headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
            _write_private(join_file, join["token"])  # by file: a command line shows in `ps`
            agent_args += ["--join-token-file", str(join_file), "--ca-hash", join["ca_hash"]]
        if fake_gpus:
            agent_args += ["--fake-gpus", fake_gpus]
        children.append(subprocess.Popen(agent_args, stdout=open(logs / "agent.log", "ab"),  # noqa: SIM115
                                         stderr=subprocess.STDOUT))
        config = save_config(url, token, data_dir)
        _banner(url, data_dir, config, fake_gpus)
        _supervise(children)
    except (RuntimeError, OSError) as exc:
        error(f"{exc} (see {logs})")
        raise typer.Exit(1) from None
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(timeout=20)
        join_file.unlink(missing_ok=True)


def _write_private(path: Path, secret: str) -> None:
    """Write `secret` to a new file at `path` that only this user can read (0600 from its creation)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(secret + "\n")


def _banner(url: str, data_dir: Path, config: Path, fake_gpus: str | None) -> None:
    gpus = f"FAKE GPUs {fake_gpus} (declared; no real GPU)" if fake_gpus else "the GPUs NVML finds"
    gp = Path(sys.argv[0]).name if Path(sys.argv[0]).name == "gpupool" else "gpupool"
    console.print(f"""
[bold green]gpupool is up[/bold green]
  control plane  {url}   (API docs: {url}/docs, metrics: {url}/metrics)
  local agent    node "local" with {gpus}
  admin token    {data_dir / 'admin.token'} (saved for the CLI in {config})

In another shell, try:
  .venv/bin/{gp} submit --gpus 0.5 -- python3 -c "import os; print('hello from', os.environ['CUDA_VISIBLE_DEVICES'])"
  .venv/bin/{gp} jobs
  .venv/bin/{gp} top
Ctrl-C here stops gpupool (running work is stopped with it).""")


def _supervise(children: list[subprocess.Popen[bytes]]) -> None:
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    while not stop["now"]:
        for child in children:
            if child.poll() is not None:
                raise RuntimeError(f"a gpupool process exited with code {child.returncode}")
        time.sleep(0.5)
