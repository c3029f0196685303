"""What every command shares: the consoles, the options, the error guard, the store.

Exit codes: 0 success, 1 the job failed (or an internal error), 2 bad input (a usage
error, an invalid TaskList or config, a path that is not a git work tree, a path no file
system takes: a NUL byte, a name or a whole path too long...). Heavy
modules (SQLAlchemy, Celery, litellm) are imported inside the commands, so that
``merlin --help`` starts at once.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from merlin_flow.errors import InputError, MerlinError

if TYPE_CHECKING:
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database

PLAIN_WIDTH = 4096
"""Line width when not on a terminal: CI logs and pipes get whole lines, never wrapped."""


def _console(stderr: bool = False) -> Console:
    """Rich's console on a terminal; elsewhere one that never wraps (unless COLUMNS says)."""
    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=PLAIN_WIDTH, soft_wrap=True)


console = _console()
err_console = _console(stderr=True)
T = TypeVar("T")


def rule(title: str) -> None:
    """A heading: a rule across a terminal, a plain line elsewhere."""
    if console.is_terminal:
        console.rule(title)
    else:
        console.print(f"── {title} ──", markup=False, highlight=False)


RepoOption = Annotated[
    str,
    typer.Option(
        "--repo",
        help="The git repository to work on: a path every worker sees, or a git URL.",
        show_default="current dir",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="MERLIN_CONFIG",
        help="merlin.toml to use instead of <repo>/merlin.toml (trusted: it may loosen).",
    ),
]
BudgetOption = Annotated[
    float | None,
    typer.Option(
        "--budget",
        help="Most the job may spend on model calls, in USD (default: budget_usd in config).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
JunitOption = Annotated[
    Path | None,
    typer.Option("--junit", help="Write JUnit XML here when the job ends: a test case per step."),
]
PatchOption = Annotated[
    Path | None, typer.Option("--patch", help="Write the job's diff here when the job ends.")
]
WaitOption = Annotated[bool, typer.Option("--wait", help="Block until the job ends.")]
QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="Print only the result on stdout (no progress); warnings and errors still go "
        "to stderr.",
    ),
]
TaskListArg = Annotated[
    str,
    typer.Argument(
        help="A TaskList file (YAML or JSON), or a request in plain words, quoted.",
        metavar="TASKLIST|REQUEST",
    ),
]
JobArg = Annotated[str, typer.Argument(help="The job id.", metavar="JOB_ID")]


def guarded(work: Callable[[], T]) -> T:
    """Run a command's work; a MerlinError is printed and exits with its code.

    An error of the database server or its connection that no retry rode out (an
    outage, a server fault) is printed in one line and exits 1. A file name the file
    system refuses as too long (one a command made of its input, past the checks of
    ``Command``) is bad input: one line, exit code 2.
    """
    from sqlalchemy.exc import DBAPIError

    try:
        return work()
    except MerlinError as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        name = shortened(os.fsdecode(exc.filename or ""))
        raise usage_error(f"the file name is too long for the file system: {name}") from None
    except DBAPIError as exc:
        reason = (str(exc.orig or exc).splitlines() or [type(exc).__name__])[0]
        err_console.print(f"[red]error:[/] the database failed: {escape(reason)}", highlight=False)
        raise typer.Exit(1) from None


def check_quiet(quiet: bool, as_json: bool) -> None:
    """InputError for ``--quiet`` with ``--json``: each says what stdout holds."""
    if quiet and as_json:
        raise InputError("--quiet and --json each choose what is printed: give one of them")


def usage_error(message: str) -> typer.Exit:
    """Print ``message`` as an error; the exit (code 2) to raise."""
    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


def state() -> tuple[Settings, Database]:
    """The settings of this process, and the database they name."""
    from merlin_flow.settings import get_settings
    from merlin_flow.store import open_database

    settings = get_settings()
    return settings, open_database(settings.database)


def check_report_paths(*paths: Path | None) -> None:
    """InputError, before any job exists, for a report path that cannot be written."""
    for path in paths:
        if path is None:
            continue
        target = path.expanduser()
        if target.is_dir():
            raise InputError(f"{path} is a directory; give a file name for the report")
        folder = next((p for p in target.absolute().parents if p.exists()), None)
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK):
            raise InputError(f"cannot write a report to {path}: {folder} is not a writable folder")


SHOWN_PATH = 60
"""Characters of a refused path an error message shows (a path may be 4 KB long)."""


def shortened(text: str) -> str:
    """``text`` cut to ``SHOWN_PATH`` characters, with an ellipsis when it was longer."""
    return text if len(text) <= SHOWN_PATH else f"{text[: SHOWN_PATH - 1]}…"


def _limit(place: str, name: str, default: int) -> int:
    """``os.pathconf``'s ``name`` for the nearest existing folder above ``place``."""
    folder = os.path.dirname(place)
    while folder != os.path.dirname(folder) and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return os.pathconf(folder or os.sep, name)
    except (OSError, ValueError):
        return default


def path_problem(value: str | os.PathLike[str]) -> str | None:
    """Why no file system takes the path ``value``, as words that follow it; None if none.

    A NUL byte, a name (a component) over the file system's ``NAME_MAX`` bytes (255 on
    Linux's), or the absolute path over ``PATH_MAX`` (4096 bytes, its NUL included):
    each is an ``OSError`` or ``ValueError`` at the first use, told here instead.
    """
    text = os.fspath(value)
    encoded = os.fsencode(text)
    if b"\0" in encoded:
        return "holds a NUL byte, which no path may"
    place = os.path.abspath(os.path.expanduser(text))
    name_max = _limit(place, "PC_NAME_MAX", 255)
    longest = max(os.fsencode(place).split(b"/"), key=len)
    if len(longest) > name_max:
        name = shortened(os.fsdecode(longest))
        return (
            f"has a name of {len(longest)} bytes ({name}), over the {name_max} a file name may have"
        )
    path_max = _limit(place, "PC_PATH_MAX", 4096)
    if len(os.fsencode(place)) >= path_max:
        return (
            f"is {len(os.fsencode(place))} bytes long as an absolute path, over the "
            f"{path_max - 1} a path may have"
        )
    return None


def check_path(value: str | os.PathLike[str], what: str) -> None:
    """InputError naming ``what`` (an option, an argument) for a path no file system takes."""
    problem = path_problem(value)
    if problem is not None:
        raise InputError(f"{what}: the path {shortened(os.fspath(value))!r} {problem}")


def _check_path_params(command: Any, ctx: Any) -> None:
    """InputError for the first path a command was given that no file system takes.

    Every ``Path`` parameter is checked, and ``--repo`` (a path, or a git URL: then not);
    an option read from its variable is named with it (``--config (MERLIN_CONFIG)``).
    """
    for param in command.params:
        value = ctx.params.get(param.name)
        if param.name == "repo" and isinstance(value, str) and value:
            from merlin_flow.workspace.repository import is_git_url

            if is_git_url(value):
                continue
        elif not isinstance(value, Path):
            continue
        what = param.opts[0] if param.param_type_name == "option" else (param.metavar or "")
        what = what or (param.name or "").upper()
        source = ctx.get_parameter_source(param.name)
        if getattr(source, "name", None) == "ENVIRONMENT":
            what = f"{what} ({param.envvar})"
        check_path(value, what)


class Command(TyperCommand):
    """A command whose usage line reads ``merlin run [OPTIONS] TASKLIST``.

    Before its work, every path it was given is checked (``path_problem``): one no file
    system takes is a usage error (exit code 2) naming the option, not an ``OSError``.
    """

    def invoke(self, ctx: Any) -> Any:
        """The command's work, once its paths are known to be paths."""
        try:
            _check_path_params(self, ctx)
        except InputError as exc:
            raise usage_error(str(exc)) from None
        return super().invoke(ctx)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """Options, then each argument by its metavar: bare when required, else in []."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces
