"""Operator commands: the audit log and organisation ceilings (public HTTP API), and master-key rotation (on the
control plane's host)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.client import Client
from gpupool.cli.cluster import refused
from gpupool.cli.render import line, show

org_app = typer.Typer(no_args_is_help=True, help=(
    "Organisations (operators): create, list, and what their tenant admins may grant (ceiling)."))

AUDIT_COLUMNS = [("at", "at"), ("actor", "actor_name"), ("kind", "actor_kind"), ("token", "token_prefix"),
                 ("org", "org"), ("method", "method"), ("route", "route"), ("object", "object_id"),
                 ("status", "status"), ("request", "request_id")]


def audit(actor: str | None = typer.Option(None, help="a user or node id"),
          org: str | None = typer.Option(None, help="organisation name"),
          method: str | None = typer.Option(None, help="POST, PUT, PATCH or DELETE"),
          route: str | None = typer.Option(None, help="route template, e.g. /api/v1/jobs/{job_id}/cancel"),
          object_id: str | None = typer.Option(None, "--object", help="the id a request named or created"),
          status: int | None = typer.Option(None, help="HTTP status, e.g. 403"),
          since: str | None = typer.Option(None, help="ISO time (UTC unless it says otherwise)"),
          until: str | None = typer.Option(None, help="ISO time"),
          limit: int = typer.Option(100, min=1, help="rows to print (pages of at most 500 are fetched)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """The audit log, newest first: every authenticated mutating request (and a sample of refused anonymous ones)
    with who, where and the outcome (operators)."""
    client, cursor = Client(), None
    rows: list[dict[str, Any]] = []
    filters = {"actor": actor, "org": org, "method": method, "route": route, "object": object_id,
               "status": status, "since": since, "until": until}
    with refused():
        while len(rows) < limit:
            page = client.get("/audit", **filters, cursor=cursor, limit=min(500, limit - len(rows)))
            rows += page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                break
    show(rows, as_json, AUDIT_COLUMNS, title="audit log")


@org_app.command("create")
def org_create(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Create an organisation (operators): a tenant with its own projects, users, queues and budgets."""
    with refused():
        out = Client().post("/orgs", {"name": name})
    if as_json:
        show(out, True)
        return
    line(f"created organisation {out['name']} ({out['id']})")
    line(f"next: gpupool project create NAME --org {out['name']}; gpupool user create NAME --org {out['name']} "
         "--role tenant-admin")


@org_app.command("list")
def org_list(wide: bool = typer.Option(False, "--wide", help="whole ids"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """The organisations you may see (operators: all)."""
    with refused():
        rows = Client().get("/orgs")
    show(rows, as_json, [("organisation", "name"), ("id", "id")], title="organisations", wide=wide)


def rotate_master_key(data_dir: Path = typer.Option(Path("gpupool-data"), help="the control plane's data dir"),
                      database_url: str | None = typer.Option(None, help="default: SQLite in the data dir"),
                      master_key_file: Path | None = typer.Option(None, help="default: DATA_DIR/master.key")) -> None:
    """Re-wrap every organisation's data key with a new master key (run on the control plane's host; it may keep
    running). Exit 1 if anything is left undecryptable."""
    args = [sys.executable, "-m", "gpupool.server", "rotate-master-key", "--data-dir", str(data_dir)]
    for flag, value in (("--database-url", database_url), ("--master-key-file", master_key_file)):
        if value:
            args += [flag, str(value)]
    os.execv(sys.executable, args)


@org_app.command("ceiling")
def org_ceiling(name: str,
                guaranteed_gpus: str | None = typer.Option(None, help="the most its top-level queues guarantee"),
                guaranteed_cpus: str | None = typer.Option(None),
                guaranteed_memory_mib: int | None = typer.Option(None),
                limit_gpus: str | None = typer.Option(None, help="every queue's limit must be at most this"),
                no_limit: bool = typer.Option(False, "--no-limit", help="no cap on queues' limits"),
                weight: int | None = typer.Option(None, help="the most its top-level queues' weights add up to"),
                max_priority: int | None = typer.Option(None, help="the highest priority of any of its queues"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """Show an organisation's ceiling, or (operators) change the parts given: what its tenant admins may grant its
    queues. Without one: no guarantee, any limit, weight 1, priority at most 0."""
    client = Client()
    with refused():
        current = client.get(f"/orgs/{name}/ceiling")
        body = _ceiling_body(current, guaranteed_gpus, guaranteed_cpus, guaranteed_memory_mib, limit_gpus, no_limit,
                             weight, max_priority)
        if body is not None:
            current = client.request("PUT", f"/orgs/{name}/ceiling", json=body).json()
    show(current if as_json else [current], as_json, CEILING_COLUMNS, title=f"ceiling of {name}")


CEILING_COLUMNS = [("guaranteed", "guaranteed"), ("limit", "limit"), ("weight", "over_quota_weight"),
                   ("max priority", "max_priority"), ("granted", "granted_guaranteed"),
                   ("granted weight", "granted_over_quota_weight")]


def _ceiling_body(current: dict[str, Any], gpus: str | None, cpus: str | None, memory_mib: int | None,
                  limit_gpus: str | None, no_limit: bool, weight: int | None,
                  max_priority: int | None) -> dict[str, Any] | None:
    """The whole ceiling to PUT: `current` with the given parts changed; None when none is given."""
    given = {"gpus": gpus, "cpus": cpus, "memory_mib": memory_mib}
    if all(v is None for v in (*given.values(), limit_gpus, weight, max_priority)) and not no_limit:
        return None
    limit = None if no_limit else current["limit"]
    if limit_gpus is not None:
        limit = {**(limit or {}), "gpus": limit_gpus}
    return {"guaranteed": {**current["guaranteed"], **{k: v for k, v in given.items() if v is not None}},
            "limit": limit, "over_quota_weight": current["over_quota_weight"] if weight is None else weight,
            "max_priority": current["max_priority"] if max_priority is None else max_priority}
