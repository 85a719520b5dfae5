"""Operator commands: the audit log (public HTTP API) and master-key rotation (on the control plane's host)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.client import ApiError, Client
from gpupool.cli.cluster import fail
from gpupool.cli.render import show

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
    try:
        while len(rows) < limit:
            page = client.get("/audit", **filters, cursor=cursor, limit=min(500, limit - len(rows)))
            rows += page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                break
    except ApiError as exc:
        fail(exc)
        return
    show(rows, as_json, AUDIT_COLUMNS, title="audit log")


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
