"""Following a job from the command line: live progress, the outcome, the CI reports.

Also the two ways a command gets a job worked: by the workers (``enqueue``) or by a
worker in this process (``run_embedded``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer
from rich.markup import escape

from merlin_flow.cli.common import T, console, err_console, rule

if TYPE_CHECKING:
    from merlin_flow.jobs.logs import LogEntry
    from merlin_flow.jobs.views import JobView
    from merlin_flow.store import Database
    from workers.roles import EmbeddedWorker


def enqueue(db: Database, job_id: str) -> None:
    """Publish what is left of the job for the workers (``merlin worker``).

    The job is recorded already: if an outage stops the publishing, it is not lost (a
    worker's recovery sweep publishes a queued step whose message is missing), so this
    warns instead of failing a command whose job exists.
    """
    from workers.app import publish_job

    reason = publish_job(db, job_id)
    if reason is not None:
        err_console.print(
            f"[yellow]warning: job {job_id} is recorded, but its tasks could not be "
            f"published ({escape(reason)}): a worker's recovery sweep will publish them "
            "(within seconds on Redis and the embedded broker, after "
            "MERLIN_HANDOFF_SECONDS on others)[/]",
            highlight=False,
        )


class OnInterrupt(StrEnum):
    """What Ctrl-C does to a job worked in this process (``merlin run --on-interrupt``)."""

    ASK = "ask"
    CANCEL = "cancel"
    DETACH = "detach"


INTERRUPTED = 130
"""Exit code after Ctrl-C, as shells report a SIGINT."""


def run_embedded(
    db: Database,
    job_id: str,
    as_json: bool,
    until: Callable[[], T] | None = None,
    on_interrupt: OnInterrupt = OnInterrupt.ASK,
) -> T | None:
    """Work the job with a worker in this process until ``until`` (default: finish) returns.

    Ctrl-C cancels the job or leaves it for the workers (``on_interrupt``; ``ask`` asks
    on a terminal and cancels elsewhere), says which, and exits 130.
    """
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
            finish(db, job_id, as_json, workers_here=True)
            return None
        return until()
    except KeyboardInterrupt:
        if _decide(on_interrupt, job_id) is OnInterrupt.DETACH:
            worker.abandon()
            _say_detached(job_id)
        else:
            _cancel_here(db, job_id, worker)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        worker.stop()


def _decide(on_interrupt: OnInterrupt, job_id: str) -> OnInterrupt:
    """The flag's choice; for ``ask``, the user's on a terminal, else cancel."""
    import sys

    from rich.prompt import Prompt

    if on_interrupt is not OnInterrupt.ASK:
        return on_interrupt
    if not (sys.stdin.isatty() and err_console.is_terminal):
        return OnInterrupt.CANCEL
    try:
        answer = Prompt.ask(
            f"\ninterrupted: [bold]cancel[/] job {job_id}, or [bold]detach[/] it and leave "
            "it to `merlin worker`?",
            choices=["cancel", "detach"],
            default="cancel",
            console=err_console,
        )
    except (KeyboardInterrupt, EOFError):
        return OnInterrupt.CANCEL
    return OnInterrupt(answer)


def _cancel_here(db: Database, job_id: str, worker: EmbeddedWorker) -> None:
    """Cancel the job and wait for this process's worker to stop its step."""
    from merlin_flow.errors import InputError
    from merlin_flow.jobs.control import cancel_job
    from merlin_flow.settings import get_settings

    try:
        cancel_job(db, get_settings(), job_id)
    except InputError as exc:  # it ended, or its last step passed, meanwhile
        err_console.print(f"interrupted; {escape(str(exc))}", highlight=False)
        return
    err_console.print(
        f"interrupted: job {job_id} cancelled; waiting for its running step to stop (a "
        "command it runs is stopped at once; Ctrl-C again to stop waiting)",
        highlight=False,
    )
    try:
        view = _wait_quietly(db, job_id)
    except KeyboardInterrupt:
        worker.abandon()
        err_console.print(
            f"job {job_id} is cancelled; a worker's recovery sweep closes it "
            f"(`merlin status {job_id}`)",
            highlight=False,
        )
        raise typer.Exit(INTERRUPTED) from None
    err_console.print(
        f"job {job_id} {view['status']}; branch {view['branch']} kept as it was "
        f"(`merlin resume {job_id}` continues it)",
        highlight=False,
    )


def _say_detached(job_id: str) -> None:
    err_console.print(
        f"interrupted: job {job_id} detached and still running. `merlin worker` (same "
        "MERLIN_HOME, or the same database and broker) continues it; the step in progress "
        f"is taken over once its lease lapses.\n  watch it:  merlin watch {job_id}\n"
        f"  cancel it: merlin cancel {job_id}",
        highlight=False,
    )


@contextmanager
def stop_waiting_on_interrupt(job_id: str) -> Iterator[None]:
    """Ctrl-C while waiting on a job the workers run: say it goes on, exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        err_console.print(
            f"\nstopped waiting; job {job_id} goes on with the workers.\n"
            f"  watch it:  merlin watch {job_id}\n  cancel it: merlin cancel {job_id}",
            highlight=False,
        )
        raise typer.Exit(INTERRUPTED) from None


def no_worker_notice(db: Database, job_id: str | None = None) -> str | None:
    """What to say when no live worker serves merlin's queues (None for an ended job)."""
    from merlin_flow.jobs.views import job_view

    if job_id is not None and job_view(db, job_id)["finished_at"] is not None:
        return None  # nothing to wait for: no need of the workers' queues (nor of Celery)
    from merlin_flow.engine.presence import no_worker_notice as notice
    from merlin_flow.settings import get_settings
    from workers.queues import ALL_QUEUES

    return notice(db, get_settings(), tuple(ALL_QUEUES))


def warn_if_no_worker(db: Database, job_id: str | None = None) -> None:
    """Print ``no_worker_notice`` as a warning on stderr, if there is one."""
    message = no_worker_notice(db, job_id)
    if message:
        err_console.print(f"[yellow]warning: {escape(message)}[/]", highlight=False)


def finish(
    db: Database,
    job_id: str,
    as_json: bool,
    junit: Path | None = None,
    patch: Path | None = None,
    workers_here: bool = False,
    quiet: bool = False,
) -> None:
    """Show the job until it ends, write the CI reports asked for; exit 1 unless completed.

    Unless a worker runs in this process (``workers_here``), warn first when no worker
    serves the queues. ``quiet``: no progress, and the outcome in one line.
    """
    from merlin_flow.jobs.reports import junit_xml, write_atomically
    from merlin_flow.jobs.views import job_diff
    from merlin_flow.settings import get_settings
    from merlin_flow.store.status import JobStatus

    if not workers_here:
        warn_if_no_worker(db, job_id)
    view = follow(db, job_id, as_json or quiet)
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
    elif quiet:
        console.print(outcome_line(view), markup=False, highlight=False)
    else:
        _print_outcome(view)
    if view["status"] != JobStatus.COMPLETED:
        raise typer.Exit(1)


def follow(db: Database, job_id: str, quiet: bool) -> JobView:
    """Wait for the job to end, with live progress unless ``quiet``; its final view."""
    from merlin_flow.cli.render import follow as follow_live
    from merlin_flow.cli.render import steps_table
    from merlin_flow.jobs.logs import last_tool_calls
    from merlin_flow.jobs.views import events_since, job_view

    if quiet:
        return _wait_quietly(db, job_id)
    view = follow_live(
        console,
        lambda: job_view(db, job_id),
        lambda after: events_since(db, job_id, after),
        load_tool_calls=lambda: last_tool_calls(db, job_id),
    )
    if not console.is_terminal:
        console.print(steps_table(view, plain=True))
    return view


def follow_logs(db: Database, job_id: str, step_key: str | None, as_json: bool = False) -> None:
    """Print the job's log as it is written, until the job ends: text, or JSON lines."""
    import os
    import sys

    from merlin_flow.cli.transcripts import attempt_footer, attempt_header, message_lines
    from merlin_flow.jobs.logs import follow_log

    for line in follow_log(db, job_id, step_key):
        if as_json:  # one object a line, flushed at once for a pipe's reader
            try:
                sys.stdout.write(json.dumps(line) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # the reader has gone (`| head -1`): stop following
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return
            continue
        kind = line["type"]
        entry = cast("LogEntry", {**line, "number": line["attempt"]})  # its fields, renamed
        if kind == "attempt_start":
            console.print(attempt_header(entry))
        elif kind == "attempt_restarted":
            console.print(f"(attempt {line['attempt']} restarted on another worker)")
        elif kind == "message":
            for text in message_lines(line["message"]):
                console.print(text)
        elif kind == "attempt_end":
            console.print(
                f"── attempt {line['attempt']} of step {line['step']}: {line['status']}",
                highlight=False,
            )
            for text in attempt_footer(entry):
                console.print(text)


def show_diff(db: Database, job_id: str) -> None:
    """Print the job's patch, highlighted."""
    from rich.syntax import Syntax

    from merlin_flow.jobs.views import job_view

    view = job_view(db, job_id)
    if not (view["patch"] and Path(view["patch"]).is_file()):
        return
    rule(f"diff of {view['branch']}")
    text = Path(view["patch"]).read_text()
    if console.is_terminal:
        console.print(Syntax(text, "diff", theme="ansi_dark"))
    else:
        console.print(text, markup=False, highlight=False, end="")


def _wait_quietly(db: Database, job_id: str) -> JobView:
    import time

    from merlin_flow.jobs.views import job_view

    while (view := job_view(db, job_id))["finished_at"] is None:
        time.sleep(0.3)
    return view


def outcome_line(view: JobView) -> str:
    """A job's end in one line: ``job 3f2c completed: branch merlin/3f2c``, or its error."""
    from merlin_flow.store.status import JobStatus

    if view["status"] == JobStatus.COMPLETED:
        return f"job {view['id']} completed: branch {view['branch']}"
    first = (view["error"] or "").strip().splitlines()
    return f"job {view['id']} {view['status']}" + (f": {first[0]}" if first else "")


def _print_outcome(view: JobView) -> None:
    from merlin_flow.store.status import JobStatus

    if view["status"] == JobStatus.COMPLETED:
        console.print(f"[green]job {view['id']} completed[/]: branch [bold]{view['branch']}[/]")
    else:
        console.print(f"[red]job {view['id']} {view['status']}[/]: {escape(view['error'] or '')}")
    if view["patch"]:
        console.print(f"patch: {view['patch']}")
