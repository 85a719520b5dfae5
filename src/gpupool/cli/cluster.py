"""Everyday commands against a running control plane (public HTTP API only)."""

from __future__ import annotations

import contextlib
import os
import re
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import typer
from rich.markup import escape

from gpupool.cli import ids
from gpupool.cli.client import ApiError, Client, save_config
from gpupool.cli.node_state import state_text
from gpupool.cli.render import console, error, line, quota, show, text

JOB_COLUMNS = [("id", "id"), ("name", "name"), ("project", "project"), ("queue", "queue"), ("state", "state"),
               ("gpus", "gpus"), ("tasks", "tasks"), ("attempt", "attempt"), ("age", "submitted_at")]
job_app = typer.Typer(no_args_is_help=True, help="Inspect or change one job.")
queue_app = typer.Typer(no_args_is_help=True, help="Manage queues.")
node_app = typer.Typer(no_args_is_help=True, help="Operate nodes.")
token_app = typer.Typer(no_args_is_help=True, help="Join tokens for new agents.")
T = TypeVar("T")
JOB_ID = typer.Argument(..., help="the job's id or a unique prefix of it (the 12 characters tables show)")


def fail(exc: ApiError) -> None:
    """End the command on a refused request (exit 1) or a control plane out of reach (exit 3): one line, and under
    `gpupool --debug` the traceback of what went wrong underneath."""
    if exc.cause is not None and os.environ.get("GPUPOOL_DEBUG"):
        traceback.print_exception(exc.cause)
    error(str(exc.detail))
    raise typer.Exit(1 if exc.status else 3)


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """Run the block's requests; a refused one or a control plane out of reach ends the command (`fail`)."""
    try:
        yield
    except ApiError as exc:
        fail(exc)


def job_id(client: Client, given: str) -> str:
    """The id of the job `given` names: a whole id, or a unique prefix of one among the jobs the caller sees (as
    git takes ids); ApiError "job not found: <given>" or one listing the candidates of an ambiguous prefix."""
    given = given.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,32}", given):
        raise ApiError(404, f"job not found: {given}")
    if len(given) == ids.FULL:
        return given
    page = client.get("/jobs", id_prefix=given, limit=ids.SHOWN + 1)
    return ids.pick(given, [j["id"] for j in page["items"]], "job")


def _job_call(given: str, call: Callable[[Client, str], T]) -> T:
    """`call(client, id)` for the job `given` names; a failure (job not found: <given>, ...) ends the command."""
    client = Client()
    try:
        return call(client, job_id(client, given))
    except ApiError as exc:
        if exc.status == 404 and exc.detail == "job not found":
            exc = ApiError(404, f"job not found: {given}")
        fail(exc)
        raise  # fail() always exits


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
    with refused():
        job = client.post("/jobs", {k: v for k, v in body.items() if v is not None},
                          headers={"Idempotency-Key": idempotency_key or uuid.uuid4().hex})
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
         limit: int = typer.Option(50, min=1, max=500), wide: bool = typer.Option(False, "--wide", help=(
             "whole ids (the table shows unique prefixes, which every command takes)")),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """List jobs, newest first."""
    with refused():
        page = Client().get("/jobs", state=state, queue=queue, project=project, tag=tag, limit=limit)
    show(page["items"], as_json, JOB_COLUMNS, title="jobs", wide=wide)


@job_app.command("show")
def job_show(job: str = JOB_ID, as_json: bool = typer.Option(False, "--json")) -> None:
    """A job with its tasks' allocations."""
    out = _job_call(job, lambda client, job_id: client.get(f"/jobs/{job_id}"))
    show(out, True) if as_json else _print_job(out)


def _print_job(job: dict[str, Any]) -> None:
    for key in ("id", "name", "project", "user", "queue", "state", "attempt", "gpus", "tasks", "command",
                "secret_env", "submitted_at", "started_at", "finished_at", "exit_code"):
        value = " ".join(job[key]) if key == "command" and isinstance(job.get(key), list) else text(job.get(key))
        _field(key, value)
    if job.get("reason"):
        _field("why pending", job["reason"]["message"])
    for alloc in job.get("allocations", []):
        line(f"{'':>15}task {alloc['task_index']} attempt {alloc['attempt']} on {alloc['node']}: "
             f"{alloc['state']} GPUs {text(alloc['gpus'])}")


def _field(name: str, value: str) -> None:
    console.print(f"[bold]{name:>13}[/bold]  {escape(value)}", soft_wrap=True, highlight=False)


@job_app.command("cancel")
def job_cancel(job: str = JOB_ID, as_json: bool = typer.Option(False, "--json")) -> None:
    """Cancel a job: its running tasks are stopped, with their grace."""
    out = _job_call(job, lambda client, job_id: client.post(f"/jobs/{job_id}/cancel"))
    show(out, True) if as_json else line(f"job {out['id']}: {out['state']}")


@job_app.command("why")
def job_why(job: str = JOB_ID, as_json: bool = typer.Option(False, "--json")) -> None:
    """Why the job is still pending, in the scheduler's words."""
    reason = _job_call(job, lambda client, job_id: client.get(f"/jobs/{job_id}/why"))
    show(reason, True) if as_json else console.print(f"[bold]{reason['kind']}[/bold]: {escape(reason['message'])}",
                                                     soft_wrap=True, highlight=False)


@job_app.command("events")
def job_events(job: str = JOB_ID, as_json: bool = typer.Option(False, "--json")) -> None:
    """What happened to the job, oldest first."""
    out = _job_call(job, lambda client, job_id: client.get(f"/jobs/{job_id}/events"))
    show(out, as_json, [("at", "at"), ("kind", "kind"), ("message", "message")])


@job_app.command("logs")
def job_logs(job: str = JOB_ID, follow: bool = typer.Option(False, "--follow", "-f"),
             task: int = typer.Option(0)) -> None:
    """Print the job's output; --follow keeps printing until the job ends."""
    _job_call(job, lambda client, job_id: _print_logs(client, job_id, follow, task))


def _print_logs(client: Client, job_id: str, follow: bool, task: int) -> None:
    offset = 0
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


@job_app.command("approve")
def job_approve(job: str = JOB_ID, note: str = typer.Option(""), as_json: bool = typer.Option(False, "--json")) -> None:
    """Approve a job awaiting approval (project admins): it becomes pending."""
    out = _job_call(job, lambda client, job_id: client.post(f"/jobs/{job_id}/approve", {"note": note}))
    show(out, True) if as_json else line(f"job {out['id']}: {out['state']}")


@job_app.command("deny")
def job_deny(job: str = JOB_ID, note: str = typer.Option(""), as_json: bool = typer.Option(False, "--json")) -> None:
    """Deny a job awaiting approval (project admins): it ends, denied."""
    out = _job_call(job, lambda client, job_id: client.post(f"/jobs/{job_id}/deny", {"note": note}))
    show(out, True) if as_json else line(f"job {out['id']}: {out['state']}")


def queues(as_json: bool = typer.Option(False, "--json")) -> None:
    """Queues with guarantees, usage, fair share and pending jobs."""
    with refused():
        show(Client().get("/queues"), as_json, [("queue", "name"), ("org", "org"), ("parent", "parent"),
                                                ("guaranteed", "guaranteed"), ("limit", "limit"),
                                                ("used GPUs", "used_gpus"),
                                                ("fair share", "fair_share_gpus"), ("pending", "pending_jobs"),
                                                ("running", "running_jobs")], title="queues")


@queue_app.command("create")
def queue_create(name: str, parent: str | None = typer.Option(None),
                 org: str | None = typer.Option(None, help="its organisation (operators; unset: a shared queue)"),
                 guaranteed_gpus: str | None = None,
                 limit_gpus: str | None = None, weight: int = typer.Option(1, min=0),
                 approval_above_gpus: str | None = None,
                 max_disconnect: int | None = typer.Option(None, min=1, help=(
                     "seconds its jobs keep running on a node cut off from every control plane (default: the "
                     "pool's max_disconnect_s; shorter moves them sooner off a node that died)")),
                 hold_unsatisfiable: bool = typer.Option(False, "--hold-unsatisfiable", help=(
                     "let jobs that no node of the pool could hold wait for capacity added on demand, instead of "
                     "refusing them at submission")),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Create a queue (tenant admins: in their organisation, within its ceiling). The quota tree is checked: a child
    never guarantees more than its parent allows; a guarantee above the pool's capacity is warned about (or refused,
    by the setting quota_above_capacity)."""
    body: dict[str, object] = {"name": name, "parent": parent, "org": org, "over_quota_weight": weight,
                               "hold_unsatisfiable": hold_unsatisfiable,
                               "approval_above_gpus": approval_above_gpus, "max_disconnect_s": max_disconnect,
                               "guaranteed": {"gpus": guaranteed_gpus} if guaranteed_gpus else {}}
    if limit_gpus:
        body["limit"] = {"gpus": limit_gpus}
    with refused():
        queue = Client().post("/queues", {k: v for k, v in body.items() if v is not None})
    show(queue, True) if as_json else print_queue("created", queue)


def print_queue(done: str, queue: dict[str, Any]) -> None:
    """A queue in words, after `done` (created, updated), and the API's warnings (a guarantee above capacity)."""
    where = f" under {queue['parent']}" if queue.get("parent") else " at the top"
    org = f" of organisation {queue['org']}" if queue.get("org") else " (shared)"
    line(f"{done} queue {queue['name']}{org}{where}: guaranteed {quota(queue.get('guaranteed'))}, limit "
         f"{quota(queue.get('limit')) if queue.get('limit') else 'none'}, over-quota weight "
         f"{queue['over_quota_weight']}, priority {queue['priority']}")
    for warning in queue.get("warnings", []):
        line(f"warning: {warning}")


@queue_app.command("update")
def queue_update(name: str, org: str | None = typer.Option(None, help="the queue's organisation (operators)"),
                 guaranteed_gpus: str | None = None, guaranteed_cpus: str | None = None,
                 limit_gpus: str | None = None, no_limit: bool = typer.Option(False, "--no-limit", help="remove "
                                                                                  "its limit"),
                 weight: int | None = typer.Option(None, min=0), priority: int | None = None,
                 approval_above_gpus: str | None = None,
                 max_disconnect: int | None = typer.Option(None, min=1, help="seconds (see queue create)"),
                 hold_unsatisfiable: bool | None = typer.Option(None, "--hold-unsatisfiable/--refuse-unsatisfiable",
                                                                help="let jobs no node could hold wait, or refuse "
                                                                     "them at submission (see queue create)"),
                 dry_run: bool = typer.Option(False, "--dry-run", help="say what would change, change nothing"),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Change a queue's guarantee, limit, weight, priority or approval threshold. The quota tree is checked: a
    child never guarantees more than its parent allows; a guarantee above the pool's capacity is warned about (or
    refused, by the setting quota_above_capacity)."""
    client = Client()
    with refused():
        current = _queue(client, name, org)
        body: dict[str, Any] = {"over_quota_weight": weight, "priority": priority,
                                "approval_above_gpus": approval_above_gpus, "max_disconnect_s": max_disconnect,
                                "hold_unsatisfiable": hold_unsatisfiable}
        body = {k: v for k, v in body.items() if v is not None}
        given = {"gpus": guaranteed_gpus, "cpus": guaranteed_cpus}
        if any(v is not None for v in given.values()):
            body["guaranteed"] = {**current["guaranteed"], **{k: v for k, v in given.items() if v is not None}}
        if no_limit or limit_gpus is not None:
            body["limit"] = None if no_limit else {**(current["limit"] or {}), "gpus": limit_gpus}
        out = client.patch(f"/queues/{name}", body, org=org, dry_run=dry_run or None)
    show(out, True) if as_json else print_change(out, "queue", name)


@queue_app.command("delete")
def queue_delete(name: str, org: str | None = typer.Option(None, help="the queue's organisation (operators)"),
                 move_to: str | None = typer.Option(None, help="the queue its waiting jobs move to"),
                 dry_run: bool = typer.Option(False, "--dry-run", help="say what would change, change nothing"),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Delete a queue (and its budget). Refused while it has child queues or placed jobs; its waiting jobs move to
    --move-to."""
    with refused():
        out = Client().delete(f"/queues/{name}", org=org, move_to=move_to, dry_run=dry_run or None)
    show(out, True) if as_json else print_change(out, "queue", name)


def _queue(client: Client, name: str, org: str | None) -> dict[str, Any]:
    """The queue `name` (of `org`) as GET /queues shows it to the caller."""
    found = [q for q in client.get("/queues") if q["name"] == name and (org is None or q["org"] == org)]
    if not found:
        raise ApiError(404, f"queue {name!r} not found")
    return dict(next((q for q in found if q["org"] is None), found[0]))


def print_change(out: dict[str, Any], what: str, name: str) -> None:
    """A change's answer (api.QueueChange, api.BudgetChange) in words: what changed or (dry run) would change."""
    lead = "would change" if out["dry_run"] else "changed"
    changes = out["changes"] or ["nothing"]
    line(f"{what} {name}: {lead} " + ("" if len(changes) > 1 else changes[0]))
    for change in changes if len(changes) > 1 else []:
        line(f"  {change}")
    if out.get("jobs_moved"):
        line(f"  jobs {'that would move' if out['dry_run'] else 'moved'}: {', '.join(out['jobs_moved'])}")
    for warning in out.get("warnings", []):
        line(f"warning: {warning}")
    if out["dry_run"]:
        line("(dry run: nothing was changed)")


#: how `gpupool nodes` shows who a node's process jobs run as (protocol.agent.JobsAs)
JOBS_AS = {"dynamic-uid": "dynamic uid", "local-user": "local user", "agent-user": "agent user",
           "root": "[bold red]ROOT[/]", "unknown": "unknown", "kubernetes": "kubernetes (its kubelet)"}


def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """Nodes, agents' and Kubernetes' (source), their GPUs (model: GPUs allocated), tasks, and who their process
    jobs run as."""
    with refused():
        data = Client().get("/nodes")
    for node in data:
        node.setdefault("source", "agent")  # a server from before sources
        node["gpu_summary"] = ", ".join(f"{g['model']}:{g['allocated_milli'] / 1000:g}" for g in node["gpus"])
        if not as_json:
            node["jobs_as"] = JOBS_AS.get(node.get("jobs_as", ""), "unknown")
            node["state"] = state_text(node)
    show(data, as_json, [("node", "name"), ("source", "source"), ("state", "state"), ("cordoned", "cordoned"),
                         ("jobs as", "jobs_as"), ("tasks", "tasks"),
                         ("GPUs (model:allocated)", "gpu_summary"), ("last seen", "last_seen")], title="nodes")


@node_app.command("cordon")
def node_cordon(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    with refused():
        nodes = Client().post(f"/nodes/{name}/cordon")
        if as_json:
            show(nodes, True)
            return
        console.print(f"node {name} cordoned: no new work")


@node_app.command("uncordon")
def node_uncordon(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    with refused():
        nodes = Client().post(f"/nodes/{name}/uncordon")
        if as_json:
            show(nodes, True)
            return
        console.print(f"node {name} uncordoned")


@node_app.command("reset")
def node_reset(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Take a node's identity back (operators): its certificates and credential are revoked, its agent cut off, its
    work requeued; a new join token may then register the name (a reinstalled or replaced machine)."""
    with refused():
        nodes = Client().post(f"/nodes/{name}/reset")
        if as_json:
            show(nodes, True)
            return
        console.print(f"node {name} reset: its agent is cut off and its work requeued; an agent may join as {name} "
                      "with a new join token")


@node_app.command("down")
def node_down(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Say a node is dead (operators): its work is requeued now rather than after its max_disconnect. Only for a
    machine you know is off: work still running there would run twice. Refused while its agent is connected."""
    with refused():
        nodes = Client().post(f"/nodes/{name}/down")
        if as_json:
            show(nodes, True)
            return
        console.print(f"node {name} marked down: its work is requeued; it takes work again when its agent returns")


def top(wide: bool = typer.Option(False, "--wide", help="whole job ids"),
        as_json: bool = typer.Option(False, "--json")) -> None:
    """Who uses what, where: every GPU grant with its project, user, node and job."""
    with refused():
        show(Client().get("/top"), as_json, [("project", "project"), ("user", "user"), ("node", "node"),
                                             ("job", "job"), ("GPUs", "gpus"), ("models", "gpu_models"),
                                             ("since", "since")], title="who uses what, where", wide=wide)


def login(url: str = typer.Option(..., help="control plane URL"),
          token: str = typer.Option(..., help="API token")) -> None:
    """Save the control plane URL and your token for later commands."""
    with refused():
        who = Client(url, token).get("/whoami")
    path = save_config(url, token)
    console.print(f"logged in as {who['user']} ({who['role']}, organisation {who['org']}); saved to {path}")


def whoami(as_json: bool = typer.Option(False, "--json")) -> None:
    """Who the saved (or GPUPOOL_TOKEN's) token speaks for: user, role, organisation and projects."""
    with refused():
        who = Client().get("/whoami")
    if as_json:
        show(who, True)
        return
    projects = ", ".join(who["projects"]) or "none (an admin sees all of the organisation's)"
    line(f"{who['user']} ({who['role']}) of organisation {who['org']}; projects: {projects}")


@token_app.command("create")
def join_token_create(ttl: int = typer.Option(3600, min=60, max=86400, help="seconds"),
                      as_json: bool = typer.Option(False, "--json")) -> None:
    """A single-use token that lets one new agent join (operators)."""
    with refused():
        out = Client().post("/join-tokens", {"ttl_s": ttl})
    if as_json:
        show(out, True)
    else:
        line(out["token"])
        line(f"(single use, expires {out['expires_at']})")
        if out.get("ca_hash"):
            line(f"pin the control plane on the node with: --ca-hash {out['ca_hash']}")
