"""Commands that read jobs: ``status``, ``list``, ``watch``, ``logs``, ``costs`` and ``doctor``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.common import ConfigOption, JobArg, JsonOption, console, guarded, state
from merlin_flow.cli.following import (
    finish,
    follow_logs,
    no_worker_notice,
    stop_waiting_on_interrupt,
)
from merlin_flow.errors import InputError

if TYPE_CHECKING:
    from merlin_flow.store.status import JobStatus


def status(
    job_id: JobArg,
    as_json: JsonOption = False,
) -> None:
    """Show a job: status, steps, tiers, attempts, exit codes."""

    def work() -> None:
        from merlin_flow.jobs.space import space_line, space_view
        from merlin_flow.jobs.views import job_view

        settings, db = state()
        view = job_view(db, job_id)
        space = space_view(db, settings, job_id, view["status"])
        if as_json:
            console.print_json(json.dumps({**view, "space": space}))
            return
        from merlin_flow.cli.render import route_lines, steps_table

        if view["request"] is not None:
            from merlin_flow.cli.approval import describe_request

            describe_request(db, view)
            if not view["steps"]:
                return
        # Only a job still running waits for the workers (and needs their queues' names).
        waiting = no_worker_notice(db) if view["finished_at"] is None else None
        note = "waiting for space" if space else ""
        plain = not console.is_terminal
        console.print(steps_table(view, plain=plain, stalled=bool(waiting), note=note))
        for line in (waiting, space and space_line(space)):
            if line:
                console.print(f"[yellow]{escape(line)}[/]", highlight=False)
        if routes := route_lines(view):
            console.print(escape(routes), highlight=False)
        console.print(f"branch: {view['branch'] or 'none'}")
        if view["error"]:
            console.print(f"[red]error:[/] {escape(view['error'])}")
        if view["patch"]:
            console.print(f"patch: {view['patch']}")

    guarded(work)


def _job_statuses(incomplete: str) -> list[str]:
    """Shell completion of ``--status``: the job statuses that start with what is typed."""
    from merlin_flow.store.status import JobStatus

    return [status.value for status in JobStatus if status.value.startswith(incomplete)]


def job_statuses(names: list[str]) -> list[JobStatus]:
    """``--status`` values as job statuses; InputError naming the known ones otherwise."""
    from merlin_flow.store.status import JobStatus

    known = [status.value for status in JobStatus]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InputError(
            f"--status {unknown[0]!r} is not a job status; the statuses: {', '.join(known)}"
        )
    return [JobStatus(name) for name in names]


def list_(
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help="Only jobs in this status (repeat it for several), e.g. failed.",
            metavar="STATUS",
            autocompletion=_job_statuses,
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, metavar="N", help="At most N jobs, the newest.")
    ] = 50,
    as_json: JsonOption = False,
) -> None:
    """List recent jobs, newest first."""

    def work() -> None:
        from merlin_flow.jobs.space import list_waiting
        from merlin_flow.jobs.views import list_jobs

        statuses = job_statuses(status or [])
        settings, db = state()
        jobs, full = list_waiting(db, settings, list_jobs(db, limit, statuses))
        if as_json:
            console.print_json(json.dumps(jobs))
            return
        from merlin_flow.cli.render import jobs_table

        console.print(jobs_table(jobs, [job["id"] for job in jobs if job["waiting_for_space"]]))
        if full is not None:
            console.print(
                f"[yellow]the disk of MERLIN_HOME ({escape(str(settings.home_dir))}) is full: "
                f"{full:.0f} MB free, {settings.min_free_mb:g} MB needed (MERLIN_MIN_FREE_MB); "
                "jobs wait for space and go on by themselves once it is freed[/]",
                highlight=False,
            )

    guarded(work)


def watch(job_id: JobArg) -> None:
    """Follow a job live (steps, status, tier, attempt, elapsed) until it ends.

    Exit code 0 when it completed, 1 when it failed, was cancelled or ran out of budget.
    """

    def work() -> None:
        from merlin_flow.jobs.views import job_status
        from merlin_flow.store.status import JobStatus

        _, db = state()
        status = job_status(db, job_id)  # an unknown job: an input error, nothing drawn
        if status in (JobStatus.AWAITING_APPROVAL, JobStatus.PLANNING):
            raise InputError(
                f"job {job_id} is {status}: nothing runs until its plan is approved "
                f"(`merlin status {job_id}` shows it, `merlin approve {job_id}` starts it)"
            )
        with stop_waiting_on_interrupt(job_id):
            finish(db, job_id, as_json=False)

    guarded(work)


def logs(
    job_id: JobArg,
    step: Annotated[str | None, typer.Option("--step", help="Only this step (its id).")] = None,
    follow_: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print the conversations as they happen, until the job ends (with --json: "
            "one JSON object a line).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """The agent transcript and exit command output of every attempt of a job."""

    def work() -> None:
        from merlin_flow.cli.transcripts import attempt_log
        from merlin_flow.jobs.logs import job_logs

        _, db = state()
        if follow_:
            job_logs(db, job_id, step)  # an unknown job or step is refused first
            with stop_waiting_on_interrupt(job_id):
                follow_logs(db, job_id, step, as_json)
            return
        entries = job_logs(db, job_id, step)
        if as_json:
            console.print_json(json.dumps(entries))
            return
        if not entries:
            console.print(f"job {job_id}: no attempt has started yet")
        for entry in entries:
            console.print(attempt_log(entry))

    guarded(work)


def costs(
    job_id: Annotated[str | None, typer.Argument(help="A job id (omit with --since).")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Totals across jobs created since, e.g. 7d.")
    ] = None,
    routing: Annotated[
        bool,
        typer.Option("--routing", help="How often the tier steps started on was right."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Calls, tokens and cost of a job (per step, tier, attempt), or totals since a time.

    With --routing: the finished steps (since --since, else all) by how they were routed
    and the tier they started on: passed there, escalated, failed, and the cost.
    """

    def work() -> None:
        from merlin_flow.cli.cost_tables import costs_since_table, job_costs_tables
        from merlin_flow.jobs.costs import CostsSince, JobCosts, costs_since, job_costs, parse_since

        if routing:
            from merlin_flow.cli.cost_tables import routing_table
            from merlin_flow.jobs.routing_report import routing_report

            if job_id is not None:
                raise InputError("--routing reports on every job: give no JOB id")
            found = routing_report(state()[1], parse_since(since) if since else None)
            if as_json:
                console.print_json(json.dumps(found))
            else:
                console.print(routing_table(found))
            return
        if (job_id is None) == (since is None):
            raise InputError("give a JOB id or --since (like --since 7d): one of the two")
        _, db = state()
        report: JobCosts | CostsSince
        if job_id is not None:
            report = job_costs(db, job_id)
            tables = job_costs_tables(report)
        else:
            report = costs_since(db, parse_since(since or ""))
            tables = [costs_since_table(report)]
        if as_json:
            console.print_json(json.dumps(report))
        else:
            for table in tables:
                console.print(table)

    guarded(work)


def doctor(
    repo: Annotated[
        Path | None, typer.Option("--repo", help="Also plan this repository's environment.")
    ] = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check that jobs can run here: sandbox, tiers, database, broker, workers, environment.

    Exits 0 when no check fails (warnings allowed), 1 otherwise.
    """

    def work() -> int:
        from rich.table import Table
        from rich.text import Text

        from merlin_flow.config import load_config
        from merlin_flow.config_files import config_files
        from merlin_flow.jobs.doctor import Verdict, run_checks
        from merlin_flow.settings import get_settings
        from merlin_flow.workspace.git import find_repository
        from workers.app import create_app
        from workers.roles import broker_report

        top = find_repository(repo) if repo is not None else None
        settings = get_settings()
        loaded = load_config(top, config, settings.home_dir, settings.system_config)
        files = config_files(top, config, settings.home_dir, settings.system_config)
        probe = create_app(settings, current=False)  # asks the broker, publishes nothing
        checks = run_checks(settings, loaded, top, lambda: broker_report(probe), files)
        failed = any(check.verdict is Verdict.FAIL for check in checks)
        if as_json:
            console.print_json(json.dumps([check.as_dict() for check in checks]))
            return 1 if failed else 0
        table = Table(title="merlin doctor", title_justify="left")
        for column in ("check", "", "found", "fix"):
            table.add_column(column, overflow="fold")
        style = {Verdict.OK: "green", Verdict.WARN: "yellow", Verdict.FAIL: "red"}
        for check in checks:
            verdict = Text(check.verdict.value, style=style[check.verdict])
            table.add_row(check.name, verdict, Text(check.detail), Text(check.fix or ""))
        console.print(table)
        return 1 if failed else 0

    raise typer.Exit(guarded(work))
