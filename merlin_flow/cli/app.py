"""The ``merlin`` command line: the typer app, and where every command is registered.

The commands live in modules named for what they do (``starting``, ``inspecting``,
``operations``); what they share is in ``common`` and ``following``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from merlin_flow import __version__
from merlin_flow.cli import (
    agents,
    approval,
    github,
    inspecting,
    operations,
    planning,
    pruning,
    starting,
    ui,
)
from merlin_flow.cli.common import Command, console, err_console

# Plain help, as git and pip print it: `--json` with no `<bool>` after it, paragraphs
# wrapped at the terminal's width, and `-h` beside `--help`.
HELP = {"help_option_names": ["-h", "--help"]}


class Group(TyperGroup):
    """A command group that lists each command's first sentence whole, wrapped if long."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The Commands section: name, then the first sentence of its help."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=Group,
    name="merlin",
    help="Run AI coding jobs as durable workflows: typed steps, verified, escalated.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=HELP,
)
db_app = typer.Typer(
    cls=Group,
    help="Manage merlin's database.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings=HELP,
)


def _version(show: bool) -> None:
    if show:
        console.print(f"merlin {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", is_eager=True, callback=_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run AI coding jobs as durable workflows: typed steps, verified, escalated."""


# In the order `merlin --help` lists them.
for command, name in (
    (planning.plan, None),
    (starting.run, None),
    (starting.submit, None),
    (operations.worker, None),
    (operations.flower, None),
    (inspecting.status, None),
    (inspecting.list_, "list"),
    (inspecting.costs, None),
    (starting.replay, None),
    (inspecting.doctor, None),
    (starting.demo, None),
    (inspecting.watch, None),
    (operations.cancel, None),
    (approval.approve, None),
    (approval.reject, None),
    (pruning.prune, None),
    (starting.resume, None),
    (inspecting.logs, None),
    (github.github, None),
    (ui.ui, None),
):
    app.command(name, cls=Command)(command)
db_app.command("upgrade", cls=Command)(operations.db_upgrade)
app.add_typer(db_app, name="db")
specs_app = typer.Typer(
    cls=Group,
    help="The project's specs: Markdown files under [specs] paths, scored for a request.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings=HELP,
)
specs_app.command("list", cls=Command)(planning.specs_list)
specs_app.command("show", cls=Command)(planning.specs_show)
app.add_typer(specs_app, name="specs")
app.add_typer(agents.agents_app, name="agents", cls=Group)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
