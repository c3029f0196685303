"""Commands that run merlin's machinery or act on it: worker, flower, cancel, db upgrade."""

from __future__ import annotations

import threading
from typing import Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.common import JobArg, console, err_console, guarded, state, usage_error


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
    shutdown_grace: Annotated[
        float,
        typer.Option(
            "--shutdown-grace",
            envvar="MERLIN_SHUTDOWN_GRACE",
            min=0,
            metavar="SECONDS",
            help="On SIGTERM, how long running tasks may go on; then they are stopped and "
            "their steps handed back to the queue, for another worker to resume.",
        ),
    ] = 5.0,
) -> None:
    """Run a Celery worker for merlin's queues.

    SIGTERM (or Ctrl-C) stops it: no new task is taken, the running ones get
    --shutdown-grace seconds to end, then each is stopped and its step handed back.
    """
    import uuid

    from merlin_flow.workspace.sandbox import sandbox_problem
    from workers.app import app as celery_app
    from workers.roles import declare_queues

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
        f"--hostname={worker_name(queues, uuid.uuid4().hex[:6])}",
        f"--pool={pool}",
    ]
    if pool not in ("prefork", "threads", "solo"):
        err_console.print(f"[red]error:[/] unknown pool {pool!r}: use prefork, threads or solo")
        raise typer.Exit(2)
    if concurrency:
        argv.append(f"--concurrency={concurrency}")
    if celery_app.conf.broker_url.startswith("sqla+"):
        declare_queues(celery_app)  # two workers starting at once must not race for them
    celery_app.conf.merlin_shutdown_grace = shutdown_grace  # read by workers.roles
    celery_app.worker_main(argv)
    from workers.roles import worker_exit_code
    from workers.shutdown import exit_at_once

    code = worker_exit_code()
    if code is not None:  # Celery's shutdown is over: the interpreter's is skipped
        exit_at_once(code)


def worker_name(queues: str, suffix: str) -> str:
    """``merlin-llm-3f2c9a@%h``: the role (its queues, or ``all``) shows in Flower and logs."""
    names = sorted({q.strip() for q in queues.split(",") if q.strip()})
    role = "all" if names == ["control", "llm", "verify"] else "-".join(names) or "none"
    return f"merlin-{role}-{suffix}@%h"


FLOWER_COLUMNS = "name,args,state,result,received,runtime,worker,uuid"
"""The tasks page's default columns, by importance: what a 1600-pixel screen shows first.

Flower caps args and result at 400 pixels; a failed task's line is in result too, so
exception is left out."""


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
    columns: Annotated[
        str,
        typer.Option(
            "--columns",
            help="Columns of Flower's tasks page, in order (Flower's --tasks_columns).",
        ),
    ] = FLOWER_COLUMNS,
    or_idle: Annotated[
        bool,
        typer.Option(
            "--or-idle",
            help="Where the broker cannot feed Flower (the embedded one), say why and stay "
            "idle instead of exiting 2: for process managers that stop every process when "
            "one exits (honcho, the Procfile).",
        ),
    ] = False,
) -> None:
    """Run Flower on merlin's Celery app (needs Redis or RabbitMQ as the broker).

    Without --basic-auth, Flower's HTTP API stays closed (unless FLOWER_UNAUTHENTICATED_API
    is set) and the UI binds to 127.0.0.1 only. Flower keeps tasks in memory; job history
    is merlin's store (`merlin list`, `merlin status`). The tasks page opens on the
    columns that fit a 1600-pixel screen: name, args (job, tier and attempt, step),
    state, result (a failed task's one line too), received, runtime, worker; the uuid,
    which links to a task's page, comes last.
    """
    from merlin_flow.settings import get_settings

    settings = get_settings()
    if settings.broker_is_embedded:
        why = (
            "Flower needs Redis or RabbitMQ as the broker (the embedded broker has no event "
            "fanout): set MERLIN_BROKER_URL=redis://host:6379/0 (or amqp://...) for the "
            "workers and for Flower"
        )
        if not or_idle:
            raise usage_error(why)
        err_console.print(
            f"flower not started: {why}; `merlin list` and `merlin watch JOB` show the jobs",
            highlight=False,
        )
        threading.Event().wait()  # until the process manager stops us
    if basic_auth is not None and ":" not in basic_auth.strip(":"):
        raise usage_error("--basic-auth must be user:password")
    from workers.app import app as celery_app

    argv = ["flower", f"--port={port}", f"--address={address}", f"--tasks_columns={columns}"]
    if basic_auth:
        argv.append(f"--basic-auth={basic_auth}")
    celery_app.start(argv)


def cancel(job_id: JobArg) -> None:
    """Cancel a job: pending steps never start, the running step and its command stop."""

    def work() -> None:
        from merlin_flow.jobs.control import cancel_job
        from merlin_flow.jobs.views import job_view

        settings, db = state()
        cancel_job(db, settings, job_id)
        view = job_view(db, job_id)
        if view["finished_at"] is None:
            console.print(
                f"job {job_id} cancelled; its running step stops (a command it runs within a "
                "second, else at its next model or tool call; `merlin watch` shows when)"
            )
        else:
            kept = f"branch {view['branch']} kept as it was" if view["branch"] else "no branch"
            console.print(f"job {job_id} cancelled; {kept}")

    guarded(work)


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

    guarded(work)
