"""The ``merlin`` command line: the typer app, and where every command is registered.

The commands live in modules named for what they do (``starting``, ``inspecting``,
``operations``); what they share is in ``common`` and ``following``.
"""

from __future__ import annotations

import sys

import typer

from merlin_flow.cli import inspecting, operations, starting
from merlin_flow.cli.common import err_console

app = typer.Typer(
    name="merlin",
    help="Run AI coding jobs as durable workflows: typed steps, verified, escalated.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Manage merlin's database.", no_args_is_help=True)

# In the order `merlin --help` lists them.
app.command()(starting.run)
app.command()(starting.submit)
app.command()(operations.worker)
app.command()(operations.flower)
app.command()(inspecting.status)
app.command("list")(inspecting.list_)
app.command()(inspecting.costs)
app.command()(starting.replay)
app.command()(inspecting.doctor)
app.command()(starting.demo)
app.command()(inspecting.watch)
app.command()(operations.cancel)
app.command()(starting.resume)
app.command()(inspecting.logs)
db_app.command("upgrade")(operations.db_upgrade)
app.add_typer(db_app, name="db")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
