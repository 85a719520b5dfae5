"""Everyday commands against a running control plane (public HTTP API only)."""

from __future__ import annotations

import os
import time
import uuid

import typer

from gpupool.cli.client import ApiError, Client, save_config
from gpupool.cli.render import console, error, show

JOB_COLUMNS = [("id", "id"), ("name", "name"), ("project", "project"), ("queue", "queue"), ("state", "state"),
               ("gpus", "gpus"), ("tasks", "tasks"), ("attempt", "attempt"), ("submitted", "submitted_at")]
job_app = typer.Typer(no_args_is_help=True, help="Inspect or change one job.")
queue_app = typer.Typer(no_args_is_help=True, help="Manage queues.")
node_app = typer.Typer(no_args_is_help=True, help="Operate nodes.")
token_app = typer.Typer(no_args_is_help=True, help="Join tokens for new agents.")


def fail(exc: ApiError) -> None:
    error(str(exc.detail))
    raise typer.Exit(1 if exc.status else 3)


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        out[key] = value
    return out


def _secrets(values: list[str]) -> dict[str, str]:
    """--secret-env items: NAME=VALUE, or NAME alone for $NAME of this process (keeps it off the command line).
    Messages name the variable, never its value."""
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep and name not in os.environ:
            raise typer.BadParameter("an item has no =VALUE and names no variable of this environment (the item "
                                     "is not repeated here: it may be a secret)", param_hint="--secret-env")
        out[name] = value if sep else os.environ[name]
    return out


def _seconds(text: str | None, option: str = "--limit") -> int | None:
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{text!r} is not a duration like 90, 30m, 2h", param_hint=option) from None


def submit(
    command: list[str] = typer.Argument(..., help="the command to run, after --"),
    gpus: str = typer.Option("1", help="GPUs per task: 0.1 to 0.9 in 10 % steps, or a whole number"),
    cpus: str = typer.Option("1", help="CPUs per task"),
    memory_mib: int = typer.Option(1024, min=0, help="memory per task, MiB"),
    tasks: int = typer.Option(1, min=1, help="gang size: tasks that start together"),
    min_tasks: int | None = typer.Option(None, min=1, help="start once this many tasks fit (elastic)"),
    gpu_model: list[str] = typer.Option([], help="acceptable GPU model (repeatable)"),
    gpu_memory_mib: int = typer.Option(0, min=0, help="GPU memory per task, MiB"),
    project: str | None = typer.Option(None), queue: str | None = typer.Option(None),
    name: str = typer.Option(""), image: str | None = typer.Option(None, help="container image"),
    env: list[str] = typer.Option([], help="KEY=VALUE (repeatable)"), workdir: str | None = typer.Option(None),
    priority: int = typer.Option(0), preemptible: bool = typer.Option(True),
    limit: str | None = typer.Option(None, help="runtime limit: 90, 30m, 2h, 1d"),
    max_disconnect: str | None = typer.Option(None, help="how long the tasks keep running on a node cut off from "
                                              "every control plane (90, 5m; default: the queue's, else the pool's)"),
    tag: list[str] = typer.Option([], help="KEY=VALUE (repeatable), e.g. cost-centre=cc42; KEY as a Kubernetes "
                                  "label key (letters, digits, . _ / -), VALUE up to 256 characters"),
    secret_env: list[str] = typer.Option([], help="NAME=VALUE, or NAME to take the value from this shell's "
                                                  "environment (repeatable): stored encrypted, never shown again"),
    idempotency_key: str | None = typer.Option(None, help="retry-safe submission key (default: random)"),
    wait: bool = typer.Option(False, help="wait until the job ends; exit with its exit code"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Submit a job: gpupool submit --gpus 0.5 -- python train.py"""
    body = {"command": command, "gpus": gpus, "cpus": cpus, "memory_mib": memory_mib, "tasks": tasks,
            "min_tasks": min_tasks, "gpu_models": gpu_model, "gpu_memory_mib": gpu_memory_mib, "project": project,
            "queue": queue, "name": name, "image": image, "env": _pairs(env, "--env"), "workdir": workdir,
            "priority": priority, "preemptible": preemptible, "runtime_limit_s": _seconds(limit),
            "max_disconnect_s": _seconds(max_disconnect, "--max-disconnect"),
            "tags": _pairs(tag, "--tag"), "secret_env": _secrets(secret_env)}
    client = Client()
    try:
        job = client.post("/jobs", {k: v for k, v in body.items() if v is not None},
                          headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
    except ApiError as exc:
        fail(exc)
        return
    if as_json:
        show(job, True)
    else:
        console.print(f"submitted job [bold]{job['id']}[/bold] ({job['state']})\n"
                      f"watch it: gpupool job show {job['id']}    logs: gpupool job logs {job['id']} --follow")
    if wait:
        raise typer.Exit(_wait(client, job["id"]))


def _wait(client: Client, job_id: str) -> int:
    while True:
        job = client.get(f"/jobs/{job_id}")
        if job["state"] in ("succeeded", "failed", "cancelled", "denied"):
            console.print(f"job {job_id} {job['state']} (exit code {job['exit_code']})")
            return int(job["exit_code"] or 0) if job["state"] != "cancelled" else 1
        time.sleep(0.5)


def jobs(state: str | None = typer.Option(None), queue: str | None = typer.Option(None),
         project: str | None = typer.Option(None), tag: str | None = typer.Option(None, help="KEY=VALUE"),
         limit: int = typer.Option(50, min=1, max=500), as_json: bool = typer.Option(False, "--json")) -> None:
    """List jobs, newest first."""
    try:
        page = Client().get("/jobs", state=state, queue=queue, project=project, tag=tag, limit=limit)
    except ApiError as exc:
        fail(exc)
        return
    show(page["items"], as_json, JOB_COLUMNS, title="jobs")


@job_app.command("show")
def job_show(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    try:
        job = Client().get(f"/jobs/{job_id}")
    except ApiError as exc:
        fail(exc)
        return
    show(job, True) if as_json else _print_job(job)


def _print_job(job: dict[str, object]) -> None:
    for key in ("id", "name", "project", "user", "queue", "state", "attempt", "gpus", "tasks", "command",
                "secret_env", "submitted_at", "started_at", "finished_at", "exit_code"):
        console.print(f"[bold]{key:>13}[/bold]  {job.get(key)}")
    if job.get("reason"):
        console.print(f"[bold]{'why pending':>13}[/bold]  {job['reason']['message']}")  # type: ignore[index]
    for alloc in job.get("allocations", []):  # type: ignore[union-attr]
        console.print(f"{'':>15}task {alloc['task_index']} attempt {alloc['attempt']} on {alloc['node']}: "
                      f"{alloc['state']} GPUs {alloc['gpus']}")


@job_app.command("cancel")
def job_cancel(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    try:
        show(Client().post(f"/jobs/{job_id}/cancel"), as_json, None) if as_json else console.print(
            f"job {job_id}: {Client().post(f'/jobs/{job_id}/cancel')['state']}")
    except ApiError as exc:
        fail(exc)


@job_app.command("why")
def job_why(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Why the job is still pending, in the scheduler's words."""
    try:
        reason = Client().get(f"/jobs/{job_id}/why")
    except ApiError as exc:
        fail(exc)
        return
    show(reason, True) if as_json else console.print(f"[bold]{reason['kind']}[/bold]: {reason['message']}")


@job_app.command("events")
def job_events(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
    try:
        show(Client().get(f"/jobs/{job_id}/events"), as_json, [("at", "at"), ("kind", "kind"), ("message", "message")])
    except ApiError as exc:
        fail(exc)


@job_app.command("logs")
def job_logs(job_id: str, follow: bool = typer.Option(False, "--follow", "-f"), task: int = typer.Option(0)) -> None:
    """Print the job's output; --follow keeps printing until the job ends."""
    client, offset = Client(), 0
    try:
        while True:
            response = client.request("GET", f"/jobs/{job_id}/logs", params={"offset": offset, "task": task})
            if response.text:
                console.out(response.text, end="", highlight=False)
            offset = int(response.headers.get("X-Next-Offset", offset))
            if not follow or response.headers.get("X-Job-State") in ("succeeded", "failed", "cancelled", "denied"):
                if not response.text:
                    return
                continue
            time.sleep(0.5)
    except ApiError as exc:
        fail(exc)


@job_app.command("approve")
def job_approve(job_id: str, note: str = typer.Option("")) -> None:
    try:
        console.print(f"job {job_id}: {Client().post(f'/jobs/{job_id}/approve', {'note': note})['state']}")
    except ApiError as exc:
        fail(exc)


@job_app.command("deny")
def job_deny(job_id: str, note: str = typer.Option("")) -> None:
    try:
        console.print(f"job {job_id}: {Client().post(f'/jobs/{job_id}/deny', {'note': note})['state']}")
    except ApiError as exc:
        fail(exc)


def queues(as_json: bool = typer.Option(False, "--json")) -> None:
    """Queues with guarantees, usage, fair share and pending jobs."""
    try:
        show(Client().get("/queues"), as_json, [("queue", "name"), ("org", "org"), ("parent", "parent"),
                                                ("guaranteed", "guaranteed"), ("limit", "limit"),
                                                ("used GPUs", "used_gpus"),
                                                ("fair share", "fair_share_gpus"), ("pending", "pending_jobs"),
                                                ("running", "running_jobs")], title="queues")
    except ApiError as exc:
        fail(exc)


@queue_app.command("create")
def queue_create(name: str, parent: str | None = typer.Option(None), guaranteed_gpus: str | None = None,
                 limit_gpus: str | None = None, weight: int = typer.Option(1, min=0),
                 approval_above_gpus: str | None = None,
                 max_disconnect: int | None = typer.Option(None, min=1, help=(
                     "seconds its jobs keep running on a node cut off from every control plane (default: the "
                     "pool's max_disconnect_s; shorter moves them sooner off a node that died)")),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    body: dict[str, object] = {"name": name, "parent": parent, "over_quota_weight": weight,
                               "approval_above_gpus": approval_above_gpus, "max_disconnect_s": max_disconnect,
                               "guaranteed": {"gpus": guaranteed_gpus} if guaranteed_gpus else {}}
    if limit_gpus:
        body["limit"] = {"gpus": limit_gpus}
    try:
        show(Client().post("/queues", {k: v for k, v in body.items() if v is not None}), True)
    except ApiError as exc:
        fail(exc)


#: how `gpupool nodes` shows who a node's process jobs run as (protocol.agent.JobsAs)
JOBS_AS = {"dynamic-uid": "dynamic uid", "local-user": "local user", "agent-user": "agent user",
           "root": "[bold red]ROOT[/]", "unknown": "unknown", "kubernetes": "kubernetes (its kubelet)"}


def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """Nodes and their GPUs (allocated fraction, utilisation, temperature), and who their process jobs run as."""
    try:
        data = Client().get("/nodes")
    except ApiError as exc:
        fail(exc)
        return
    for node in data:
        node["gpu_summary"] = ", ".join(f"{g['model']}:{g['allocated_milli'] / 1000:g}" for g in node["gpus"])
        if not as_json:
            node["jobs_as"] = JOBS_AS.get(node.get("jobs_as", ""), "unknown")
    show(data, as_json, [("node", "name"), ("state", "state"), ("cordoned", "cordoned"), ("jobs as", "jobs_as"),
                         ("GPUs (model:allocated)", "gpu_summary"), ("last seen", "last_seen")], title="nodes")


@node_app.command("cordon")
def node_cordon(name: str) -> None:
    try:
        Client().post(f"/nodes/{name}/cordon")
        console.print(f"node {name} cordoned: no new work")
    except ApiError as exc:
        fail(exc)


@node_app.command("uncordon")
def node_uncordon(name: str) -> None:
    try:
        Client().post(f"/nodes/{name}/uncordon")
        console.print(f"node {name} uncordoned")
    except ApiError as exc:
        fail(exc)


@node_app.command("reset")
def node_reset(name: str) -> None:
    """Take a node's identity back (operators): its certificates and credential are revoked, its agent cut off, its
    work requeued; a new join token may then register the name (a reinstalled or replaced machine)."""
    try:
        Client().post(f"/nodes/{name}/reset")
        console.print(f"node {name} reset: its agent is cut off and its work requeued; an agent may join as {name} "
                      "with a new join token")
    except ApiError as exc:
        fail(exc)


@node_app.command("down")
def node_down(name: str) -> None:
    """Say a node is dead (operators): its work is requeued now rather than after its max_disconnect. Only for a
    machine you know is off: work still running there would run twice. Refused while its agent is connected."""
    try:
        Client().post(f"/nodes/{name}/down")
        console.print(f"node {name} marked down: its work is requeued; it takes work again when its agent returns")
    except ApiError as exc:
        fail(exc)


def top(as_json: bool = typer.Option(False, "--json")) -> None:
    """Who uses what, where: every GPU grant with its project, user, node and job."""
    try:
        show(Client().get("/top"), as_json, [("project", "project"), ("user", "user"), ("node", "node"),
                                             ("job", "job"), ("GPUs", "gpus"), ("models", "gpu_models"),
                                             ("since", "since")], title="who uses what, where")
    except ApiError as exc:
        fail(exc)


def login(url: str = typer.Option(..., help="control plane URL"),
          token: str = typer.Option(..., help="API token")) -> None:
    """Save the control plane URL and your token for later commands."""
    try:
        who = Client(url, token).get("/whoami")
    except ApiError as exc:
        fail(exc)
        return
    path = save_config(url, token)
    console.print(f"logged in as {who['user']} ({who['role']}, organisation {who['org']}); saved to {path}")


@token_app.command("create")
def join_token_create(ttl: int = typer.Option(3600, min=60, max=86400, help="seconds"),
                      as_json: bool = typer.Option(False, "--json")) -> None:
    """A single-use token that lets one new agent join (operators)."""
    try:
        out = Client().post("/join-tokens", {"ttl_s": ttl})
    except ApiError as exc:
        fail(exc)
        return
    if as_json:
        show(out, True)
    else:
        console.print(f"{out['token']}\n(single use, expires {out['expires_at']})")
        if out.get("ca_hash"):
            console.print(f"pin the control plane on the node with: --ca-hash {out['ca_hash']}")
