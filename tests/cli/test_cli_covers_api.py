"""Every route of the live API has a `gpupool` command, with `--json` (issue 43): the test walks the OpenAPI spec of
a running control plane and fails for a route that neither COMMANDS nor NOT_FOR_PEOPLE names, for a command that does
not exist, and for one without `--json` that PLAIN does not excuse. A new route needs a command (or a reason here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from gpupool.cli.main import app
from gpupool.devtools.harness import Server, start_server, stop_server

COMMANDS = {  # "METHOD /path" -> the command that calls it
    "POST /api/v1/nodes/{name}/drain": "node drain",
    "POST /api/v1/nodes/{name}/undrain": "node undrain",
    "DELETE /api/v1/nodes/{name}": "node remove",
    "GET /api/v1/whoami": "whoami",
    "GET /api/v1/orgs": "org list",
    "POST /api/v1/orgs": "org create",
    "GET /api/v1/orgs/{name}/ceiling": "org ceiling",
    "PUT /api/v1/orgs/{name}/ceiling": "org ceiling",
    "GET /api/v1/projects": "project list",
    "POST /api/v1/projects": "project create",
    "GET /api/v1/users": "user list",
    "POST /api/v1/users": "user create",
    "GET /api/v1/tokens": "token list",
    "POST /api/v1/tokens": "token create",
    "DELETE /api/v1/tokens/{token_id}": "token revoke",
    "POST /api/v1/join-tokens": "join-token create",
    "GET /api/v1/queues": "queues",
    "POST /api/v1/queues": "queue create",
    "PATCH /api/v1/queues/{name}": "queue update",
    "DELETE /api/v1/queues/{name}": "queue delete",
    "POST /api/v1/jobs": "submit",
    "GET /api/v1/jobs": "jobs",
    "GET /api/v1/jobs/{job_id}": "job show",
    "POST /api/v1/jobs/{job_id}/cancel": "job cancel",
    "POST /api/v1/jobs/{job_id}/approve": "job approve",
    "POST /api/v1/jobs/{job_id}/deny": "job deny",
    "GET /api/v1/jobs/{job_id}/events": "job events",
    "GET /api/v1/jobs/{job_id}/why": "job why",
    "GET /api/v1/jobs/{job_id}/logs": "job logs",
    "GET /api/v1/nodes": "nodes",
    "POST /api/v1/nodes/{name}/cordon": "node cordon",
    "POST /api/v1/nodes/{name}/uncordon": "node uncordon",
    "POST /api/v1/nodes/{name}/reset": "node reset",
    "POST /api/v1/nodes/{name}/down": "node down",
    "GET /api/v1/top": "top",
    "GET /api/v1/prices": "price list",
    "PUT /api/v1/prices": "price set",
    "GET /api/v1/resource-prices": "price list",
    "PUT /api/v1/resource-prices": "price cpu",
    "GET /api/v1/budgets": "budget list",
    "POST /api/v1/budgets": "budget create",
    "PATCH /api/v1/budgets/{budget_id}": "budget update",
    "DELETE /api/v1/budgets/{budget_id}": "budget delete",
    "GET /api/v1/usage": "usage",
    "GET /api/v1/usage/statement": "statement",
    "GET /api/v1/cluster/samples": "samples",
    "GET /api/v1/audit": "audit",
}
NOT_FOR_PEOPLE = {  # "METHOD /path" -> why no command calls it
    "POST /api/v1/agent/register": "a node agent joins with it (`gpupool agent --join-token` calls it)",
    "POST /api/v1/sessions": "the dashboard's sign-in: it trades a pasted API token for a session token",
    "DELETE /api/v1/sessions/current": "the dashboard's \"Log out\" of its session token",
}  # /healthz, /readyz, /version and /metrics are not in the spec: probes and Prometheus call them
PLAIN = {  # commands whose output is not JSON, and why
    "job logs": "the job's own output, as it wrote it",
    "statement": "a statement is a CSV or HTML document (--format)",
    "usage": "--format json (besides table and csv)",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(Path(tmp_path_factory.mktemp("spec")) / "data")
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def spec(server: Server) -> set[str]:
    paths = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    return {f"{method.upper()} {path}" for path, item in paths.items() for method in item
            if method in ("get", "put", "post", "patch", "delete")}


def _command(words: str) -> Any:
    """The click command `gpupool WORDS` runs (typer's own click: a group has `commands`), or None."""
    command: Any = typer.main.get_command(app)
    for word in words.split():
        command = getattr(command, "commands", {}).get(word)
    return command


def test_every_route_has_a_command_or_a_reason(spec: set[str]) -> None:
    missing = sorted(spec - set(COMMANDS) - set(NOT_FOR_PEOPLE))
    assert not missing, f"routes without a CLI command (add one, or a reason to NOT_FOR_PEOPLE): {missing}"
    stale = sorted((set(COMMANDS) | set(NOT_FOR_PEOPLE)) - spec)
    assert not stale, f"rows for routes the API no longer has: {stale}"


def test_every_command_exists_and_answers_json() -> None:
    for route, words in COMMANDS.items():
        command = _command(words)
        assert command is not None, f"{route}: no command `gpupool {words}`"
        flags = {flag for param in command.params for flag in getattr(param, "opts", [])}
        assert "--json" in flags or words in PLAIN, f"`gpupool {words}` has no --json"


def test_the_sign_in_page_names_the_command_that_makes_a_token(server: Server) -> None:
    page = httpx.get(f"{server.url}/js/pages/login.js", timeout=30).text
    assert "gpupool token create" in page and "POST /api/v1/tokens" not in page
    assert _command("token create") is not None
