"""The ``merlin`` command line.

Exit codes: 0 success, 1 the job failed (or an internal error), 2 bad input (a usage
error, an invalid TaskList or config, a path that is not a git work tree...). Heavy
modules (SQLAlchemy, Celery, litellm) are imported inside the commands, so that
``merlin --help`` starts at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from merlin_flow.errors import ConfigError, InputError, MerlinError

if TYPE_CHECKING:
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database

app = typer.Typer(
    name="merlin",
    help="Run AI coding jobs as durable workflows: typed steps, verified, escalated.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Manage merlin's database.", no_args_is_help=True)
app.add_typer(db_app, name="db")

console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")

RepoOption = Annotated[
    str,
    typer.Option(
        "--repo",
        help="The git repository to work on: a path every worker sees, or a git URL.",
        show_default="current dir",
    ),
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="merlin.toml to use instead of <repo>/merlin.toml.")
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
TaskListArg = Annotated[Path, typer.Argument(help="TaskList file (YAML or JSON).")]


def _guarded(work: Callable[[], T]) -> T:
    try:
        return work()
    except MerlinError as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(exc.exit_code) from None


def _state() -> tuple[Settings, Database]:
    from merlin_flow.settings import get_settings
    from merlin_flow.store import open_database

    settings = get_settings()
    return settings, open_database(settings.database)


def _prepare(
    tasklist_path: Path,
    repo: str,
    config_path: Path | None,
    budget: float | None,
    local: bool = False,
    check_tiers: bool = True,
) -> tuple[Any, ...]:
    """Validate input and create the job; nothing is enqueued yet.

    ``local``: this process works the job, so its sandbox must run here.
    """
    from merlin_flow.config import load_config, scripts_inside
    from merlin_flow.jobs import create_job, default_exit_commands
    from merlin_flow.repository import refusals_as_input_errors, repository_for_input
    from merlin_flow.tasklist import load_tasklist

    if budget is not None and not budget > 0:
        raise InputError(f"--budget must be more than 0 USD, not {budget:g}")
    tasklist = load_tasklist(tasklist_path)
    tasklist.check_submittable()
    settings, db = _state()
    source = repository_for_input(repo, settings)
    with refusals_as_input_errors(source):
        base = source.base_commit()
    with source.files_at(base) as files:  # one checkout for a URL: config and exit commands
        config = load_config(files, config_path)
        if source.url is not None and scripts_inside(config, files):
            raise ConfigError(
                f"merlin.toml in {repo} names scripted models by paths inside the repository, "
                "and workers do not read files from a git URL's checkout: give --config"
            )
        commands = default_exit_commands(tasklist, config, files)
    _check_runnable(config, check_tiers)
    if local:
        from merlin_flow.sandbox import check_sandbox

        check_sandbox(config.sandbox)
    job_id = create_job(
        db, settings, tasklist, source, config, budget, base_commit=base, exit_commands=commands
    )
    return settings, db, job_id


def _check_runnable(config: Any, check_tiers: bool = True) -> None:
    """Refuse a job no attempt could do; warn when its commands run unconfined."""
    from merlin_flow.config import SandboxMode
    from merlin_flow.credentials import require_a_usable_tier
    from merlin_flow.execution import SANDBOX_OFF_WARNING

    if check_tiers:
        require_a_usable_tier(config)
    if config.sandbox.mode is SandboxMode.NONE:
        err_console.print(f"[yellow]{escape(SANDBOX_OFF_WARNING)}[/]", highlight=False)


def check_report_paths(*paths: Path | None) -> None:
    """InputError, before any job exists, for a report path that cannot be written."""
    import os

    for path in paths:
        if path is None:
            continue
        target = path.expanduser()
        if target.is_dir():
            raise InputError(f"{path} is a directory; give a file name for the report")
        folder = next((p for p in target.absolute().parents if p.exists()), None)
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK):
            raise InputError(f"cannot write a report to {path}: {folder} is not a writable folder")


def _finish(
    db: Database,
    job_id: str,
    as_json: bool,
    junit: Path | None = None,
    patch: Path | None = None,
) -> None:
    """Show the job until it ends, write the CI reports asked for; exit 1 unless completed."""
    from merlin_flow.jobs import job_diff
    from merlin_flow.reports import junit_xml, write_atomically
    from merlin_flow.settings import get_settings

    view = _follow(db, job_id, as_json)
    try:
        if junit is not None:
            write_atomically(junit, junit_xml(view))
        if patch is not None:
            write_atomically(patch, job_diff(db, get_settings(), job_id))
    except OSError as exc:  # checked before the job ran; the disk may still fail now
        err_console.print(f"[red]error:[/] cannot write a report: {escape(str(exc))}")
        raise typer.Exit(1) from None
    if as_json:
        console.print_json(json.dumps(view))
    else:
        _print_outcome(view)
    if view["status"] != "completed":
        raise typer.Exit(1)


def _follow(db: Database, job_id: str, quiet: bool) -> dict[str, Any]:
    """Wait for the job to end, with live progress unless ``quiet``; its final view."""
    from merlin_flow.cli.render import follow, steps_table
    from merlin_flow.jobs import events_since, job_view

    if quiet:
        return _wait_quietly(db, job_id)
    view = follow(
        console, lambda: job_view(db, job_id), lambda after: events_since(db, job_id, after)
    )
    if not console.is_terminal:
        console.print(steps_table(view))
    return view


def _wait_quietly(db: Database, job_id: str) -> dict[str, Any]:
    import time

    from merlin_flow.jobs import job_view

    while (view := job_view(db, job_id))["finished_at"] is None:
        time.sleep(0.3)
    return view


def _print_outcome(view: dict[str, Any]) -> None:
    if view["status"] == "completed":
        console.print(f"[green]job {view['id']} completed[/]: branch [bold]{view['branch']}[/]")
    else:
        console.print(f"[red]job {view['id']} {view['status']}[/]: {escape(view['error'] or '')}")
    if view["patch"]:
        console.print(f"patch: {view['patch']}")


@app.command()
def run(
    tasklist: TaskListArg,
    repo: RepoOption = ".",
    config: ConfigOption = None,
    budget: BudgetOption = None,
    as_json: JsonOption = False,
    junit: JunitOption = None,
    patch: PatchOption = None,
) -> None:
    """Submit a TaskList and work it in this process, with live progress."""

    def work() -> None:
        check_report_paths(junit, patch)
        _settings, db, job_id = _prepare(tasklist, repo, config, budget, local=True)
        _run_embedded(db, job_id, as_json, until=lambda: _finish(db, job_id, as_json, junit, patch))

    _guarded(work)


def _run_embedded(
    db: Database, job_id: str, as_json: bool, until: Callable[[], T] | None = None
) -> T | None:
    """Work the job with a worker in this process until ``until`` (default: _finish) returns."""
    from merlin_flow.workflow import enqueue_job
    from workers.app import app as celery_app
    from workers.roles import EmbeddedWorker

    worker = EmbeddedWorker(celery_app)
    enqueue_job(db, job_id)
    if not as_json:
        console.print(f"job [bold]{job_id}[/] submitted; working it in this process")
    worker.start()
    try:
        if until is None:
            _finish(db, job_id, as_json)
            return None
        return until()
    finally:
        worker.stop()


@app.command()
def submit(
    tasklist: TaskListArg,
    repo: RepoOption = ".",
    config: ConfigOption = None,
    budget: BudgetOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Block until the job ends.")] = False,
    as_json: JsonOption = False,
    junit: JunitOption = None,
    patch: PatchOption = None,
    workers_hold_keys: Annotated[
        bool,
        typer.Option(
            "--workers-hold-keys",
            help="Skip the check that a tier's key or server is reachable from here: the "
            "workers have their own environment.",
        ),
    ] = False,
) -> None:
    """Enqueue a TaskList for the workers (`merlin worker`) and print the job id.

    For pipelines: `--wait --json` prints the final job as JSON and exits 0 (completed),
    1 (failed, cancelled, budget exceeded) or 2 (bad input); `--junit` and `--patch`
    write reports when the job ends.
    """

    def work() -> None:
        if (junit or patch) and not wait:
            raise InputError("--junit and --patch are written when the job ends: add --wait")
        check_report_paths(junit, patch)
        _settings, db, job_id = _prepare(
            tasklist, repo, config, budget, check_tiers=not workers_hold_keys
        )
        from merlin_flow.workflow import enqueue_job
        from workers.app import app as celery_app

        celery_app.set_default()
        enqueue_job(db, job_id)
        if as_json:
            if not wait:
                console.print_json(json.dumps({"job_id": job_id}))
        else:
            console.print(job_id)
        if wait:
            _finish(db, job_id, as_json, junit, patch)

    _guarded(work)


@app.command()
def worker(
    queues: Annotated[
        str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume.")
    ] = "control,llm,verify",
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Worker processes.", min=1)
    ] = None,
    pool: Annotated[
        str,
        typer.Option(
            "--pool", "-P", help="prefork for exit commands (CPU), threads for the llm queue (I/O)."
        ),
    ] = "prefork",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    sandbox: Annotated[
        str,
        typer.Option(
            "--sandbox",
            help="bwrap: refuse to start without bubblewrap. none: start without it; "
            "jobs that ask for the sandbox then fail on this worker, with the reason.",
        ),
    ] = "bwrap",
) -> None:
    """Run a Celery worker for merlin's queues."""
    import uuid

    from merlin_flow.sandbox import sandbox_problem
    from workers.app import app as celery_app

    if sandbox not in ("bwrap", "none"):
        err_console.print(f"[red]error:[/] unknown --sandbox {sandbox!r}: use bwrap or none")
        raise typer.Exit(2)
    problem = sandbox_problem() if sandbox == "bwrap" else None
    if problem:
        err_console.print(f"[red]error:[/] {escape(problem)}", highlight=False)
        err_console.print("start it with --sandbox none to serve only unsandboxed jobs")
        raise typer.Exit(2)
    if sandbox == "none":
        err_console.print(
            "[yellow]warning: this worker has no sandbox; a job that asks for bwrap fails "
            "on it with the reason[/]"
        )

    argv = [
        "worker",
        f"--queues={queues}",
        f"--loglevel={loglevel}",
        f"--hostname=merlin-{uuid.uuid4().hex[:6]}@%h",
        f"--pool={pool}",
    ]
    if pool not in ("prefork", "threads", "solo"):
        err_console.print(f"[red]error:[/] unknown pool {pool!r}: use prefork, threads or solo")
        raise typer.Exit(2)
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    celery_app.worker_main(argv)


@app.command()
def flower(
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 5555,
    address: Annotated[
        str, typer.Option("--address", help="Interface to bind (all: 0.0.0.0).")
    ] = "127.0.0.1",
    basic_auth: Annotated[
        str | None,
        typer.Option(
            "--basic-auth",
            envvar="MERLIN_FLOWER_BASIC_AUTH",
            help="user:password for the UI and the HTTP API (env MERLIN_FLOWER_BASIC_AUTH).",
        ),
    ] = None,
) -> None:
    """Run Flower on merlin's Celery app (needs the Redis broker).

    Without --basic-auth, Flower's HTTP API stays closed (unless FLOWER_UNAUTHENTICATED_API
    is set) and the UI binds to 127.0.0.1 only. Flower keeps tasks in memory; job history
    is merlin's store (`merlin list`, `merlin status`).
    """
    from merlin_flow.settings import get_settings

    settings = get_settings()
    if settings.broker_is_embedded:
        raise _usage_error(
            "Flower needs the Redis broker (the embedded broker has no event fanout): "
            "set MERLIN_BROKER_URL=redis://host:6379/0 for the workers and for Flower"
        )
    if basic_auth is not None and ":" not in basic_auth.strip(":"):
        raise _usage_error("--basic-auth must be user:password")
    from workers.app import app as celery_app

    argv = ["flower", f"--port={port}", f"--address={address}"]
    if basic_auth:
        argv.append(f"--basic-auth={basic_auth}")
    celery_app.start(argv)


def _usage_error(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    as_json: JsonOption = False,
) -> None:
    """Show a job: status, steps, tiers, attempts, exit codes."""

    def work() -> None:
        from merlin_flow.cli.render import steps_table
        from merlin_flow.jobs import job_view

        _, db = _state()
        view = job_view(db, job_id)
        if as_json:
            console.print_json(json.dumps(view))
            return
        console.print(steps_table(view))
        console.print(f"branch: {view['branch']}")
        if view["error"]:
            console.print(f"[red]error:[/] {escape(view['error'])}")
        if view["patch"]:
            console.print(f"patch: {view['patch']}")

    _guarded(work)


@app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """List recent jobs, newest first."""

    def work() -> None:
        from merlin_flow.cli.render import jobs_table
        from merlin_flow.jobs import list_jobs

        _, db = _state()
        jobs = list_jobs(db)
        if as_json:
            console.print_json(json.dumps(jobs))
        else:
            console.print(jobs_table(jobs))

    _guarded(work)


@app.command()
def costs(
    job_id: Annotated[str | None, typer.Argument(help="A job id (omit with --since).")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Totals across jobs created since, e.g. 7d.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Calls, tokens and cost of a job (per step, tier, attempt), or totals since a time."""

    def work() -> None:
        from merlin_flow.cli.render import costs_since_table, job_costs_tables
        from merlin_flow.costs import costs_since, job_costs, parse_since

        if (job_id is None) == (since is None):
            raise InputError("give a JOB id or --since (like --since 7d): one of the two")
        _, db = _state()
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

    _guarded(work)


@app.command()
def replay(
    job_id: Annotated[str, typer.Argument(help="A finished job to replay.")],
    as_json: JsonOption = False,
) -> None:
    """Re-run a finished job offline from its journal, on a new branch, and compare.

    Exit code 0 when the replay reached the same attempts and trees at every step.
    """

    def work() -> None:
        from merlin_flow.cli.render import replay_table
        from merlin_flow.replay import compare, create_replay

        settings, db = _state()
        replay_id = create_replay(db, settings, job_id)
        _run_embedded(db, replay_id, as_json, until=lambda: _follow(db, replay_id, as_json))
        report = compare(db, settings, replay_id)
        if as_json:
            console.print_json(json.dumps(report.to_json()))
        else:
            console.print(replay_table(report))
            verdict = "[green]reproduced[/]" if report.reproduced else "[red]NOT reproduced[/]"
            console.print(
                f"replay {replay_id} of {job_id}: {verdict}; "
                f"{report.identical_requests}/{report.calls} requests identical to the original's"
            )
            for line in report.differences:
                console.print(f"  - {escape(line)}", highlight=False)
        if not report.reproduced:
            raise typer.Exit(1)

    _guarded(work)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or upgrade the schema of MERLIN_DATABASE_URL to the newest revision."""

    def work() -> None:
        from merlin_flow.settings import get_settings
        from merlin_flow.store import Database, upgrade
        from merlin_flow.store.database import current_revision

        settings = get_settings()
        db = Database(settings.database)
        upgrade(db)
        console.print(f"database at revision {current_revision(db)}: {db.engine.url!r}")

    _guarded(work)


@app.command()
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
        from merlin_flow.doctor import Verdict, run_checks
        from merlin_flow.settings import get_settings
        from merlin_flow.workspace import find_repository

        top = find_repository(repo) if repo is not None else None
        checks = run_checks(get_settings(), load_config(top, config), top)
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

    raise typer.Exit(_guarded(work))


@app.command()
def demo() -> None:
    """Run a bundled 3-step job with scripted models, showing a tier escalation."""

    def work() -> None:
        from merlin_flow.demo import prepare_demo
        from merlin_flow.jobs import create_job

        settings, db = _state()
        demo_repo, tasklist, config = prepare_demo()

        console.rule("merlin demo")
        console.print(
            "[bold yellow]Models are scripted[/]: offline and deterministic, replaying "
            "examples/demo/*.yaml. The demo shows the workflow (verify, fix, escalate), "
            "not model quality."
        )
        console.print(f"throwaway repository: {demo_repo}")
        job_id = create_job(db, settings, tasklist, demo_repo, config)
        try:
            _run_embedded(db, job_id, as_json=False)
        finally:
            _show_diff(db, job_id)

    _guarded(work)


def _show_diff(db: Database, job_id: str) -> None:
    from rich.syntax import Syntax

    from merlin_flow.jobs import job_view

    view = job_view(db, job_id)
    if view["patch"] and Path(view["patch"]).is_file():
        console.rule(f"diff of {view['branch']}")
        console.print(Syntax(Path(view["patch"]).read_text(), "diff", theme="ansi_dark"))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


# Commands on submitted jobs live in their own module; importing it registers them.
from merlin_flow.cli import operations as _operations  # noqa: E402, F401
