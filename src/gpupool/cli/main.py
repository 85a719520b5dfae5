"""The `gpupool` command. Thin: parse, call, render."""

from __future__ import annotations

import typer

from gpupool.cli import sim

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="gpupool: pool every GPU of an organisation and hand it out dynamically.")
app.add_typer(sim.app, name="sim")


if __name__ == "__main__":
    app()
