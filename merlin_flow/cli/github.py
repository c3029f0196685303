"""``merlin github``: one GitHub Actions event, answered in its thread.

Everything comes from the variables GitHub Actions sets; a test sets them itself, with
``GITHUB_API_URL`` at a fake GitHub and the checkout's ``origin`` at a bare repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from merlin_flow.cli.common import BudgetOption, ConfigOption, err_console, guarded
from merlin_flow.errors import InputError

if TYPE_CHECKING:
    from merlin_flow.github.events import Outcome

REQUIRED = ("GITHUB_EVENT_NAME", "GITHUB_EVENT_PATH", "GITHUB_REPOSITORY", "GITHUB_WORKSPACE")


def github(
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="MERLIN_GITHUB_TOKEN",
            help="Token to comment, push and open pull requests with (default: GITHUB_TOKEN).",
            show_default=False,
        ),
    ] = None,
    label: Annotated[str, typer.Option("--label", help="The label that starts merlin.")] = "merlin",
    auto_label: Annotated[
        str, typer.Option("--auto-label", help="The label that runs a plan without approval.")
    ] = "merlin:auto",
    trusted: Annotated[
        str,
        typer.Option("--trusted", help="Author associations whose /merlin commands are obeyed."),
    ] = "OWNER,MEMBER,COLLABORATOR",
    max_rounds: Annotated[
        int, typer.Option("--max-rounds", min=1, help="Review rounds per pull request.")
    ] = 3,
    out: Annotated[
        Path, typer.Option("--out", help="Folder for the job's patch, summary and JUnit report.")
    ] = Path("merlin-out"),
    submit_to: Annotated[
        bool,
        typer.Option(
            "--submit-to",
            help="Run approved plans on the team's workers (MERLIN_BROKER_URL and "
            "MERLIN_DATABASE_URL) and follow them, instead of on this runner.",
        ),
    ] = False,
    config: ConfigOption = None,
    budget: BudgetOption = None,
) -> None:
    """Answer the GitHub event that started this workflow: plan, run, open a pull request.

    A label (--label) or a `/merlin` comment starts it; see docs/github.md.
    Exit code 0 when done, 1 when the job failed, 2 for bad input (answered in the
    thread when it came from one; an event merlin does not handle: on stderr only).
    """

    def work() -> int:
        from merlin_flow.github.api import GitHubApi
        from merlin_flow.github.events import Options, read_event
        from merlin_flow.github.loop import Place, handle
        from merlin_flow.settings import get_settings
        from merlin_flow.store import open_database

        missing = [name for name in REQUIRED if not os.environ.get(name)]
        if missing:
            raise InputError(
                f"{', '.join(missing)} not set: `merlin github` runs in a GitHub Actions "
                "workflow (docs/github.md), which sets them"
            )
        secret = token or os.environ.get("GITHUB_TOKEN")
        if not secret:
            raise InputError("no token: set GITHUB_TOKEN (or MERLIN_GITHUB_TOKEN) for the step")
        path = Path(os.environ["GITHUB_EVENT_PATH"])
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the event payload {path}: {exc}") from None
        options = Options(label=label, trusted=frozenset(trusted.upper().split(",")))
        outcome = read_event(os.environ["GITHUB_EVENT_NAME"], payload, options)
        err_console.print(f"merlin github: {_describe(outcome)}", highlight=False, markup=False)
        settings = get_settings()
        if submit_to and not (settings.broker_url and settings.database_url):
            raise InputError(
                "--submit-to needs MERLIN_BROKER_URL and MERLIN_DATABASE_URL: the team's "
                "Redis and Postgres, from the repository's secrets"
            )
        db = open_database(settings.database)
        place = Place(
            api=GitHubApi(
                os.environ["GITHUB_REPOSITORY"],
                secret,
                os.environ.get("GITHUB_API_URL") or "https://api.github.com",
            ),
            workspace=Path(os.environ["GITHUB_WORKSPACE"]),
            token=secret,
            plan_key=os.environ.get("MERLIN_PLAN_KEY"),
            out=out,
            run_url=_run_url(),
            config_path=config,
            budget=budget,
            auto_label=auto_label,
            max_rounds=max_rounds,
            submit_to=submit_to,
        )
        return handle(outcome, place, db, settings)

    raise typer.Exit(guarded(work))


def _run_url() -> str | None:
    server, repo, run = (
        os.environ.get(name) for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")
    )
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else None


def _describe(outcome: Outcome) -> str:
    from merlin_flow.github.events import Ignore, Reply

    if isinstance(outcome, Ignore):
        return f"nothing to do ({outcome.reason})"
    if isinstance(outcome, Reply):
        return f"answering #{outcome.thread.number}: {outcome.text.splitlines()[0]}"
    return f"{outcome.command.value} in #{outcome.thread.number} from @{outcome.author}"
