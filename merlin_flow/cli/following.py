"""Following a job from the command line: live progress, the outcome, the CI reports.

Also the two ways a command gets a job worked: by the workers (``enqueue``) or by a
worker in this process (``run_embedded``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from merlin_flow.cli.common import T, console, err_console

if TYPE_CHECKING:
    from merlin_flow.jobs import JobView
    from merlin_flow.store import Database


def enqueue(db: Database, job_id: str) -> None:
    """Publish what is left of the job for the workers (``merlin worker``)."""
    from workers.app import app as celery_app
    from workers.canvas import enqueue_job

    celery_app.set_default()
    enqueue_job(db, job_id)


def run_embedded(
    db: Database, job_id: str, as_json: bool, until: Callable[[], T] | None = None
) -> T | None:
    """Work the job with a worker in this process until ``until`` (default: finish) returns."""
    from workers.app import app as celery_app
    from workers.canvas import enqueue_job
    from workers.roles import EmbeddedWorker

    worker = EmbeddedWorker(celery_app)
    enqueue_job(db, job_id)
    if not as_json:
        console.print(f"job [bold]{job_id}[/] submitted; working it in this process")
    worker.start()
    try:
        if until is None:
            finish(db, job_id, as_json)
            return None
        return until()
    finally:
        worker.stop()


def finish(
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
    from merlin_flow.store.status import JobStatus

    view = follow(db, job_id, as_json)
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
    if view["status"] != JobStatus.COMPLETED:
        raise typer.Exit(1)


def follow(db: Database, job_id: str, quiet: bool) -> JobView:
    """Wait for the job to end, with live progress unless ``quiet``; its final view."""
    from merlin_flow.cli.render import follow as follow_live
    from merlin_flow.cli.render import steps_table
    from merlin_flow.jobs import events_since, job_view

    if quiet:
        return _wait_quietly(db, job_id)
    view = follow_live(
        console, lambda: job_view(db, job_id), lambda after: events_since(db, job_id, after)
    )
    if not console.is_terminal:
        console.print(steps_table(view))
    return view


def show_diff(db: Database, job_id: str) -> None:
    """Print the job's patch, highlighted."""
    from rich.syntax import Syntax

    from merlin_flow.jobs import job_view

    view = job_view(db, job_id)
    if view["patch"] and Path(view["patch"]).is_file():
        console.rule(f"diff of {view['branch']}")
        console.print(Syntax(Path(view["patch"]).read_text(), "diff", theme="ansi_dark"))


def _wait_quietly(db: Database, job_id: str) -> JobView:
    import time

    from merlin_flow.jobs import job_view

    while (view := job_view(db, job_id))["finished_at"] is None:
        time.sleep(0.3)
    return view


def _print_outcome(view: JobView) -> None:
    from merlin_flow.store.status import JobStatus

    if view["status"] == JobStatus.COMPLETED:
        console.print(f"[green]job {view['id']} completed[/]: branch [bold]{view['branch']}[/]")
    else:
        console.print(f"[red]job {view['id']} {view['status']}[/]: {escape(view['error'] or '')}")
    if view["patch"]:
        console.print(f"patch: {view['patch']}")
