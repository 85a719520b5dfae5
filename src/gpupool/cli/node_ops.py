"""`gpupool node drain | undrain | remove` (operators; public HTTP API only)."""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli.client import Client
from gpupool.cli.cluster import _seconds, refused
from gpupool.cli.render import console, show

WORK_COLUMNS = [("job", "job"), ("task", "task_index"), ("project", "project"), ("user", "user"),
                ("state", "state")]


def drain(name: str,
          deadline: str | None = typer.Option(None, help="after this long (90, 30m, 2h, 1d), work still running "
                                              "there is stopped with the kill grace and requeued; default: never"),
          dry_run: bool = typer.Option(False, "--dry-run", help="show what runs there and would be evicted"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Take no new work on a node; what runs there ends on its own, or is evicted and requeued at the deadline."""
    body: dict[str, Any] = {"dry_run": dry_run}
    if deadline is not None:
        body["deadline_s"] = _seconds(deadline, "--deadline")
    _act(lambda c: c.post(f"/nodes/{name}/drain", body), as_json)


def undrain(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Let a drained (or cordoned) node take work again; a pending removal is called off."""
    _act(lambda c: c.post(f"/nodes/{name}/undrain"), as_json)


def remove(name: str,
           force: bool = typer.Option(False, "--force", help="requeue the work that runs there (stopped with the "
                                                             "kill grace) and remove the node once it has stopped"),
           dry_run: bool = typer.Option(False, "--dry-run", help="show what would be requeued; change nothing"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Remove a node: refused while work runs there, unless --force. Its identity is revoked and its GPUs retired;
    its usage history stays, and a new join token may take its name."""
    params = {"force": str(force).lower(), "dry_run": str(dry_run).lower()}
    _act(lambda c: c.request("DELETE", f"/nodes/{name}", params=params).json(), as_json)


def _act(call: Any, as_json: bool) -> None:
    """Run one node action and print its answer: the message, then the work it touches (or would) as a table."""
    with refused():
        out = call(Client())
    if as_json:
        show(out, True)
        return
    console.print(out["message"], soft_wrap=True, highlight=False)
    if out["work"]:
        show(out["work"], False, WORK_COLUMNS, title="would be evicted" if out["dry_run"] else "evicted")
