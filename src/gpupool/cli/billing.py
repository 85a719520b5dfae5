"""Usage, statements, budgets and prices (public HTTP API), and the invariant check."""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.client import Client, saved_data_dir
from gpupool.cli.cluster import print_change, refused
from gpupool.cli.ids import pick
from gpupool.cli.render import console, gpu_hours, line, money, show, text
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
    with refused():
        rows = Client().get("/usage", **{"from": start, "to": end, "by": by})
    if fmt == "csv":
        out = io.StringIO()
        writer = SafeWriter(out, lineterminator="\n")
        writer.writerow(["key", *USAGE_COLUMNS])
        writer.writerows([r["key"], *(r.get(k, "") for k in USAGE_COLUMNS)] for r in rows)
        console.out(out.getvalue(), highlight=False, end="")
        return
    if fmt == "table":
        rows = [r | {k: gpu_hours(r[k]) for k in USAGE_COLUMNS[:3]}
                | {"cost": money(r["cost"] * 100, r.get("currency", "USD"))} for r in rows]
    show(rows, fmt == "json", [(by, "key"), ("GPU-hours", "gpu_hours"), ("CPU-core-hours", "cpu_hours"),
                               ("memory GiB-hours", "memory_gib_hours"), ("cost", "cost"), ("entries", "entries")],
         title="usage")


def statement(project: str = typer.Option(...), month: str = typer.Option(..., help="YYYY-MM"),
              fmt: str = typer.Option("csv", "--format", help="csv or html")) -> None:
    """A project's monthly statement."""
    with refused():
        response = Client().request("GET", "/usage/statement", params={"project": project, "month": month,
                                                                        "format": fmt})
    console.out(response.text, highlight=False)


@budget_app.command("create")
def budget_create(scope: str = typer.Option(..., help="project or queue"), name: str = typer.Option(...),
                  period: str = typer.Option("month", help="day, week or month"),
                  gpu_hours: float | None = typer.Option(None), cents: int | None = typer.Option(None),
                  hard: bool = typer.Option(False, help="stop admitting new jobs once spent"),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Set a budget of GPU-hours or cents per period on a project or queue (one each); a hard one holds new jobs
    once spent. Undo one with `gpupool budget update` or `gpupool budget delete`."""
    _finite(gpu_hours)
    with refused():
        out = Client().post("/budgets", {"scope": scope, "name": name, "period": period, "gpu_hours": gpu_hours,
                                         "cents": cents, "hard": hard})
    show(out, True) if as_json else line(f"created {_budget_words(out)}")


def _finite(hours: float | None) -> None:
    if hours is not None and not math.isfinite(hours):  # JSON has no infinity; the API bounds the rest
        raise typer.BadParameter("must be a finite number of GPU-hours", param_hint="--gpu-hours")


def _amount(budget: dict[str, Any]) -> str:
    if budget["gpu_hours"] is not None:
        return f"{gpu_hours(budget['gpu_hours'])} GPU-hours"
    return money(budget["cents"], budget.get("currency", "USD"))


def _budget_words(budget: dict[str, Any]) -> str:
    kind = "hard" if budget["hard"] else "soft"
    return (f"{kind} {budget['period']}ly budget of {_amount(budget)} on {budget['scope']} {budget['name']} "
            f"({budget['id']})")


BUDGET_COLUMNS = [("scope", "scope"), ("name", "name"), ("period", "period"), ("budget", "amount"), ("hard", "hard"),
                  ("used", "used"), ("exceeded", "exceeded"), ("id", "id")]


@budget_app.command("list")
def budget_list(wide: bool = typer.Option(False, "--wide", help="whole ids"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """Budgets with what their period used so far."""
    with refused():
        rows = Client().get("/budgets")
    if not as_json:
        rows = [r | {"amount": _amount(r), "used": f"{gpu_hours(r['used_gpu_hours'])} GPU-hours" if r["gpu_hours"]
                     is not None else money(r["used_cents"], r.get("currency", "USD"))} for r in rows]
    show(rows, as_json, BUDGET_COLUMNS, title="budgets", wide=wide)


BUDGET_ARGUMENT = typer.Argument(..., help="the budget's id (or a unique prefix), or SCOPE/NAME (project/default)")


def _budget_id(client: Client, given: str) -> str:
    """The id of the budget `given` names: SCOPE/NAME (project/default, queue/vision), an id or a unique prefix."""
    rows = client.get("/budgets")
    scope, slash, name = given.partition("/")
    named = [r["id"] for r in rows if slash and (r["scope"], r["name"]) == (scope, name)]
    if len(named) == 1:
        return str(named[0])
    return pick(given, [r["id"] for r in rows], "budget")


@budget_app.command("update")
def budget_update(budget: str = BUDGET_ARGUMENT, period: str | None = typer.Option(None, help="day, week or month"),
                  gpu_hours: float | None = typer.Option(None, help="the new amount (drops --cents)"),
                  cents: int | None = typer.Option(None, help="the new amount (drops --gpu-hours)"),
                  hard: bool | None = typer.Option(None, "--hard/--soft", help="hold new jobs once spent, or not"),
                  dry_run: bool = typer.Option(False, "--dry-run", help="say what would change, change nothing"),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Change a budget: its amount, period, or whether it holds jobs (--soft undoes a hard budget set by mistake)."""
    _finite(gpu_hours)
    body = {k: v for k, v in {"period": period, "gpu_hours": gpu_hours, "cents": cents, "hard": hard}.items()
            if v is not None}
    client = Client()
    with refused():
        out = client.patch(f"/budgets/{_budget_id(client, budget)}", body, dry_run=dry_run or None)
    show(out, True) if as_json else print_change(out, "budget", _budget_words(out["budget"]))


@budget_app.command("delete")
def budget_delete(budget: str = BUDGET_ARGUMENT,
                  dry_run: bool = typer.Option(False, "--dry-run", help="say what would change, change nothing"),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Delete a budget; the jobs a hard one held may start at once."""
    client = Client()
    with refused():
        out = client.delete(f"/budgets/{_budget_id(client, budget)}", dry_run=dry_run or None)
    show(out, True) if as_json else print_change(out, "budget", _budget_words(out["budget"]))


def samples(start: str | None = typer.Option(None, "--from", help="ISO date or time, default 30 days ago"),
            end: str | None = typer.Option(None, "--to", help="ISO date or time, default now"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """The cluster's figures over time, as the control plane sampled them: GPUs, allocated, used, GPU allocation
    rate (GAR: allocated / GPUs) and GPU fragmentation rate (GFR: share of GPU nodes partly allocated)."""
    with refused():
        rows = Client().get("/cluster/samples", **{"from": start, "to": end})
    if not as_json:
        rows = [r | {"gar": f"{100 * r['gar']:.1f}%", "gfr": f"{100 * r['gfr']:.1f}%",
                     "used": text(round(r["used"], 2))} for r in rows]
    show(rows, as_json, [("at", "at"), ("GPUs", "gpus"), ("allocated", "allocated"), ("used", "used"),
                         ("allocation rate (GAR)", "gar"), ("fragmentation rate (GFR)", "gfr")],
         title="cluster samples")


@price_app.command("set")
def price_set(model: str, cents_per_gpu_hour: int, as_json: bool = typer.Option(False, "--json")) -> None:
    """The price of one GPU of `model` for an hour, in cents of the pool's currency."""
    with refused():
        out = Client().request("PUT", "/prices", json={"model": model, "cents_per_gpu_hour": cents_per_gpu_hour})
    show(out.json(), True) if as_json else line(f"{model}: {cents_per_gpu_hour} cents per GPU-hour")


@price_app.command("cpu")
def price_cpu(cents_per_core_hour: int, as_json: bool = typer.Option(False, "--json")) -> None:
    """The price of one CPU core for an hour, in cents."""
    _resource_price("cpu", cents_per_core_hour, "CPU-core-hour", as_json)


@price_app.command("memory")
def price_memory(cents_per_gib_hour: int, as_json: bool = typer.Option(False, "--json")) -> None:
    """The price of one GiB of memory for an hour, in cents."""
    _resource_price("memory", cents_per_gib_hour, "GiB-hour", as_json)


def _resource_price(resource: str, cents: int, unit: str, as_json: bool) -> None:
    with refused():
        out = Client().request("PUT", "/resource-prices", json={"resource": resource, "cents_per_hour": cents})
    show(out.json(), True) if as_json else line(f"{resource}: {cents} cents per {unit}")


@price_app.command("list")
def price_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """Every price: per GPU model (per GPU-hour), per CPU-core-hour and per GiB-hour of memory."""
    with refused():
        client = Client()
        rows = [{"what": p["model"], "cents_per_hour": p["cents_per_gpu_hour"], "per": "GPU-hour"}
                for p in client.get("/prices")]
        rows += [{"what": p["resource"], "cents_per_hour": p["cents_per_hour"],
                  "per": "CPU-core-hour" if p["resource"] == "cpu" else "GiB-hour"} for p in client.get(
            "/resource-prices")]
    show(rows, as_json, [("what", "what"), ("cents", "cents_per_hour"), ("per", "per")], title="prices (cents of the "
         "pool's currency)")


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
