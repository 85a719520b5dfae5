"""The `gpupool` command. Thin: parse -> client call -> render."""

from __future__ import annotations

import typer

from gpupool.cli import admin, billing, cluster, node_ops, sim, up

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="gpupool: pool every GPU of an organisation and hand it out dynamically.")
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
app.add_typer(cluster.token_app, name="join-token")
app.command()(billing.usage)
app.command()(billing.statement)
app.add_typer(billing.budget_app, name="budget")
app.add_typer(billing.price_app, name="price")
app.command()(billing.check)
app.command()(admin.audit)
app.add_typer(admin.org_app, name="org")
app.command("rotate-master-key")(admin.rotate_master_key)


if __name__ == "__main__":
    app()
