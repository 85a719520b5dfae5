"""Projects, users (with roles) and API tokens (public HTTP API only): an admin's everyday objects. Organisations
are in cli.admin (operators)."""

from __future__ import annotations

import typer

from gpupool.cli.client import Client
from gpupool.cli.cluster import _seconds, refused
from gpupool.cli.ids import pick
from gpupool.cli.render import line, show

project_app = typer.Typer(no_args_is_help=True, help="Projects: who pays and whose jobs (tenant admins).")
user_app = typer.Typer(no_args_is_help=True, help="Users and their roles (tenant admins).")
token_app = typer.Typer(no_args_is_help=True, help="API tokens: create, list, revoke.")
ROLES = "viewer, member, project-admin, tenant-admin or operator"
WIDE = typer.Option(False, "--wide", help="whole ids (a table shows unique prefixes)")
JSON = typer.Option(False, "--json", help="the API's answer as JSON")
ORG = typer.Option(None, help="organisation name (operators; default: your own)")


@project_app.command("create")
def project_create(name: str, org: str | None = ORG,
                   cost_centre: str = typer.Option("", help="shown on its statements"), as_json: bool = JSON) -> None:
    """Create a project in your organisation (or, operators, in --org)."""
    with refused():
        out = Client().post("/projects", {"name": name, "org": org, "cost_centre": cost_centre})
    show(out, True) if as_json else line(f"created project {out['name']} in organisation {out['org']} ({out['id']})")


@project_app.command("list")
def project_list(wide: bool = WIDE, as_json: bool = JSON) -> None:
    """The projects you may see."""
    with refused():
        rows = Client().get("/projects")
    show(rows, as_json, [("project", "name"), ("org", "org"), ("cost centre", "cost_centre"), ("id", "id")],
         title="projects", wide=wide)


@user_app.command("create")
def user_create(name: str, role: str = typer.Option("member", help=ROLES), org: str | None = ORG,
                project: list[str] = typer.Option([], help="a project the user works in (repeatable)"),
                as_json: bool = JSON) -> None:
    """Create a user with a role (operators alone create operators). Give them a token with `gpupool token create
    --user NAME`."""
    with refused():
        out = Client().post("/users", {"name": name, "role": role, "org": org, "projects": project})
    if as_json:
        show(out, True)
        return
    projects = ", ".join(out["projects"]) or "no project"
    line(f"created user {out['name']} ({out['role']}) in organisation {out['org']}, working in {projects}")
    line(f"give them a token: gpupool token create --user {out['name']}")


@user_app.command("list")
def user_list(wide: bool = WIDE, as_json: bool = JSON) -> None:
    """Users of your organisation (operators: all) with their roles and projects."""
    with refused():
        rows = Client().get("/users")
    show(rows, as_json, [("user", "name"), ("role", "role"), ("org", "org"), ("projects", "projects"), ("id", "id")],
         title="users", wide=wide)


@token_app.command("create")
def token_create(name: str = typer.Option("", help="what the token is for"),
                 user: str | None = typer.Option(None, help="a user of your organisation (admins; default: you)"),
                 org: str | None = typer.Option(None, help="the user's organisation (operators)"),
                 ttl: str | None = typer.Option(None, help="lifetime: 3600, 30d, 12h (default: no expiry)"),
                 as_json: bool = JSON) -> None:
    """Create an API token; its secret is shown once. The user logs in with `gpupool login --url URL --token T`."""
    with refused():
        out = Client().post("/tokens", {"name": name, "user": user, "org": org, "ttl_s": _seconds(ttl, "--ttl")})
    if as_json:
        show(out, True)
        return
    line(out["token"])
    expiry = f"expires {out['expires_at']}" if out.get("expires_at") else "no expiry"
    line(f"(token {out['id']} of {out['user']}, {expiry}; shown once: keep it secret)")


TOKEN_COLUMNS = [("id", "id"), ("prefix", "prefix"), ("name", "name"), ("user", "user"), ("expires", "expires_at"),
                 ("revoked", "revoked_at")]


@token_app.command("list")
def token_list(wide: bool = WIDE, as_json: bool = JSON) -> None:
    """Your tokens (admins: your organisation's; operators: all), never their secrets."""
    with refused():
        rows = Client().get("/tokens")
    show(rows, as_json, TOKEN_COLUMNS, title="tokens", wide=wide)


@token_app.command("revoke")
def token_revoke(token: str = typer.Argument(..., help="the token's id (or a unique prefix of it) or its prefix"),
                 as_json: bool = JSON) -> None:
    """Revoke a token at once: requests with it are refused from now on."""
    client = Client()
    with refused():
        rows = client.get("/tokens")
        by_prefix = [r["id"] for r in rows if r["prefix"] == token]
        token_id = by_prefix[0] if len(by_prefix) == 1 else pick(token, [r["id"] for r in rows], "token")
        client.request("DELETE", f"/tokens/{token_id}")
    show({"id": token_id, "revoked": True}, True) if as_json else line(f"revoked token {token_id}")
