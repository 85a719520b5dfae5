"""The `gpupool` command. Thin: parse -> client call -> render.

Failures a person can act on (a refused request, a control plane out of reach, a database that refuses the
password) print one line saying what failed and what to check; `gpupool --debug ...` prints the traceback too."""

from __future__ import annotations

import os
import sys
import traceback

import httpx
import typer

import gpupool
from gpupool.cli import admin, billing, cluster, node_ops, sim, tenancy, up
from gpupool.cli.client import ApiError, load_config, unreachable
from gpupool.cli.render import error

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="gpupool: pool every GPU of an organisation and hand it out dynamically.")
#: set by --debug (and passed on as GPUPOOL_DEBUG=1 to the server and check processes the CLI execs)
DEBUG_ENV = "GPUPOOL_DEBUG"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {gpupool.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help="print gpupool's version and exit"),
             debug: bool = typer.Option(False, "--debug", help="print the traceback of a failure")) -> None:
    """gpupool: pool every GPU of an organisation and hand it out dynamically."""
    if debug:
        os.environ[DEBUG_ENV] = "1"


app.add_typer(sim.app, name="sim")
app.command()(up.up)
app.command()(up.server)
app.command()(up.agent)
app.command(context_settings={"allow_interspersed_args": False})(cluster.submit)
app.command()(cluster.jobs)
app.add_typer(cluster.job_app, name="job")
app.command()(cluster.queues)
app.add_typer(cluster.queue_app, name="queue")
app.command()(cluster.nodes)
app.add_typer(cluster.node_app, name="node")
cluster.node_app.command("drain")(node_ops.drain)
cluster.node_app.command("undrain")(node_ops.undrain)
cluster.node_app.command("resume", hidden=True)(node_ops.undrain)
cluster.node_app.command("remove")(node_ops.remove)
app.command()(cluster.top)
app.command()(cluster.login)
app.command()(cluster.whoami)
app.add_typer(cluster.token_app, name="join-token")
app.command()(billing.usage)
app.command()(billing.statement)
app.command("samples")(billing.samples)
app.add_typer(billing.budget_app, name="budget")
app.add_typer(billing.price_app, name="price")
app.command()(billing.check)
app.command()(admin.audit)
app.add_typer(admin.org_app, name="org")
app.add_typer(tenancy.project_app, name="project")
app.add_typer(tenancy.user_app, name="user")
app.add_typer(tenancy.token_app, name="token")
app.command("rotate-master-key")(admin.rotate_master_key)


def main() -> None:
    """Run the command; a failure it did not handle is one line (with the traceback under --debug)."""
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - the last stop before a user: one line, never a traceback
        if os.environ.get(DEBUG_ENV) or "--debug" in _options_given():
            traceback.print_exc()
        error(_failure(exc))
        raise SystemExit(1) from None


def _options_given() -> list[str]:
    """The command line's words before a `--` (after it: a job's own command), where `--debug` may stand (`gpupool
    --debug ...` or `gpupool sim --debug ...`)."""
    words = sys.argv[1:]
    return words[:words.index("--")] if "--" in words else words


def _failure(exc: Exception) -> str:
    """What failed, in one line, and what to check."""
    if isinstance(exc, ApiError):
        return exc.detail
    if isinstance(exc, httpx.HTTPError):
        return unreachable(load_config()[0], exc)
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    what = f"{type(exc).__name__}{f': {first}' if first else ''}"
    return f"unexpected {what} (run `gpupool --debug ...` for the traceback)"


if __name__ == "__main__":
    main()
