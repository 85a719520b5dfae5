"""Usage, statements, budgets and prices (public HTTP API), and the invariant check."""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path

import typer

from gpupool.cli.client import ApiError, Client, saved_data_dir
from gpupool.cli.cluster import fail
from gpupool.cli.render import console, show
from gpupool.protocol.csvsafe import SafeWriter

budget_app = typer.Typer(no_args_is_help=True, help="GPU-hour or money budgets per project or queue.")
price_app = typer.Typer(no_args_is_help=True, help="Prices per GPU model, CPU-core-hour and GiB-hour (operators).")
USAGE_COLUMNS = ("gpu_hours", "cpu_hours", "memory_gib_hours", "cost", "entries")


def usage(start: str | None = typer.Option(None, "--from", help="ISO date, default 30 days ago"),
          end: str | None = typer.Option(None, "--to", help="ISO date, default now"),
          by: str = typer.Option("project", help="project, user, queue, model, job or tag:<key>"),
          fmt: str = typer.Option("table", "--format", help="table, csv or json")) -> None:
    """GPU-hours, CPU-core-hours, memory GiB-hours and cost from the metering ledger, grouped."""
    if fmt not in ("table", "csv", "json"):
        raise typer.BadParameter("choose table, csv or json", param_hint="--format")
    try:
        rows = Client().get("/usage", **{"from": start, "to": end, "by": by})
    except ApiError as exc:
        fail(exc)
        return
    if fmt == "csv":
        out = io.StringIO()
        writer = SafeWriter(out, lineterminator="\n")
        writer.writerow(["key", *USAGE_COLUMNS])
        writer.writerows([r["key"], *(r.get(k, "") for k in USAGE_COLUMNS)] for r in rows)
        console.out(out.getvalue(), highlight=False, end="")
        return
    show(rows, fmt == "json", [(by, "key"), ("GPU-hours", "gpu_hours"), ("CPU-core-hours", "cpu_hours"),
                               ("memory GiB-hours", "memory_gib_hours"), ("cost", "cost"), ("entries", "entries")],
         title="usage")


def statement(project: str = typer.Option(...), month: str = typer.Option(..., help="YYYY-MM"),
              fmt: str = typer.Option("csv", "--format", help="csv or html")) -> None:
    """A project's monthly statement."""
    try:
        response = Client().request("GET", "/usage/statement", params={"project": project, "month": month,
                                                                        "format": fmt})
    except ApiError as exc:
        fail(exc)
        return
    console.out(response.text, highlight=False)


@budget_app.command("create")
def budget_create(scope: str = typer.Option(..., help="project or queue"), name: str = typer.Option(...),
                  period: str = typer.Option("month", help="day, week or month"),
                  gpu_hours: float | None = typer.Option(None), cents: int | None = typer.Option(None),
                  hard: bool = typer.Option(False, help="stop admitting new jobs once spent")) -> None:
    if gpu_hours is not None and not math.isfinite(gpu_hours):  # JSON has no infinity; the API bounds the rest
        raise typer.BadParameter("must be a finite number of GPU-hours", param_hint="--gpu-hours")
    try:
        show(Client().post("/budgets", {"scope": scope, "name": name, "period": period, "gpu_hours": gpu_hours,
                                        "cents": cents, "hard": hard}), True)
    except ApiError as exc:
        fail(exc)


@budget_app.command("list")
def budget_list(as_json: bool = typer.Option(False, "--json")) -> None:
    try:
        show(Client().get("/budgets"), as_json, [("scope", "scope"), ("name", "name"), ("period", "period"),
                                                 ("GPU-hours", "gpu_hours"), ("cents", "cents"), ("hard", "hard"),
                                                 ("used GPU-h", "used_gpu_hours"), ("used cents", "used_cents"),
                                                 ("exceeded", "exceeded")], title="budgets")
    except ApiError as exc:
        fail(exc)


@price_app.command("set")
def price_set(model: str, cents_per_gpu_hour: int) -> None:
    try:
        Client().request("PUT", "/prices", json={"model": model, "cents_per_gpu_hour": cents_per_gpu_hour})
        console.print(f"{model}: {cents_per_gpu_hour} cents per GPU-hour")
    except ApiError as exc:
        fail(exc)


@price_app.command("cpu")
def price_cpu(cents_per_core_hour: int) -> None:
    """The price of one CPU core for an hour, in cents."""
    _resource_price("cpu", cents_per_core_hour, "CPU-core-hour")


@price_app.command("memory")
def price_memory(cents_per_gib_hour: int) -> None:
    """The price of one GiB of memory for an hour, in cents."""
    _resource_price("memory", cents_per_gib_hour, "GiB-hour")


def _resource_price(resource: str, cents: int, unit: str) -> None:
    try:
        Client().request("PUT", "/resource-prices", json={"resource": resource, "cents_per_hour": cents})
        console.print(f"{resource}: {cents} cents per {unit}")
    except ApiError as exc:
        fail(exc)


@price_app.command("list")
def price_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """Every price: per GPU model (per GPU-hour), per CPU-core-hour and per GiB-hour of memory."""
    try:
        client = Client()
        rows = [{"what": p["model"], "cents_per_hour": p["cents_per_gpu_hour"], "per": "GPU-hour"}
                for p in client.get("/prices")]
        rows += [{"what": p["resource"], "cents_per_hour": p["cents_per_hour"],
                  "per": "CPU-core-hour" if p["resource"] == "cpu" else "GiB-hour"} for p in client.get(
            "/resource-prices")]
    except ApiError as exc:
        fail(exc)
        return
    show(rows, as_json, [("what", "what"), ("cents", "cents_per_hour"), ("per", "per")], title="prices")


def check(data_dir: Path | None = typer.Option(None, help="the control plane's data dir (default: the one `gpupool "
                                                       "up` last started on this host, else gpupool-data)"),
          database_url: str | None = typer.Option(None, help="check this database instead (default: "
                                                             "$GPUPOOL_DATABASE_URL, else DATA_DIR/gpupool.db)"),
          ) -> None:
    """Verify the invariants (no double allocation, balanced ledger, ...) on the control plane's database, found as
    the control plane finds it; exit 1 on a violation, 2 when there is no database there."""
    where = ["--database-url", database_url] if database_url else [
        "--data-dir", str(data_dir or saved_data_dir() or Path("gpupool-data"))]
    os.execv(sys.executable, [sys.executable, "-m", "gpupool.server.check", *where])
