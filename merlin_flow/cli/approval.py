"""Requests on the command line: ``run``/``submit`` of a request, the review, approve, reject.

``run`` and ``submit`` take a TaskList file or, when the argument is not an existing
file, a request in plain words (``requesting.submit_request`` plans it). A plan waits for
approval: ``--yes`` gives it at submission; ``merlin run`` on a terminal shows the
preview and asks (approve, edit the YAML in ``$EDITOR``, reject); ``merlin approve JOB``
and ``merlin reject JOB`` decide later.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.common import (
    JobArg,
    JsonOption,
    WaitOption,
    check_path,
    console,
    err_console,
    guarded,
    path_problem,
    state,
)
from merlin_flow.errors import InputError

if TYPE_CHECKING:
    from merlin_flow.jobs.requesting import RequestSubmission
    from merlin_flow.jobs.views import JobView
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database
    from merlin_flow.tasklist import TaskList

TASKLIST_SUFFIXES = (".yaml", ".yml", ".json")
NEEDS_APPROVAL = (
    "the request is planned, and a plan runs only once approved: run it on a terminal to "
    "review the plan, pass --yes to approve it unseen, or `merlin submit` it and "
    "`merlin approve` the job later"
)

YesOption = Annotated[
    bool,
    typer.Option(
        "--yes", "-y", help="Approve the plan of a request without review (for CI pipelines)."
    ),
]


def tasklist_file(argument: str) -> Path | None:
    """The TaskList file ``argument`` names; None when it is a request in plain words.

    A single word that ends like a TaskList file but names none is a mistyped path, not a
    request: InputError; so is a single word with a ``/`` that no file system takes (a
    name or a path too long). A request longer than a file name may be is a request.
    """
    words = argument.split()
    one_path = len(words) == 1 and (argument.lower().endswith(TASKLIST_SUFFIXES) or "/" in argument)
    if path_problem(argument) is not None:
        if one_path:
            check_path(argument, "TASKLIST")
        return None
    path = Path(argument)
    if path.is_file():
        return path
    if len(words) == 1 and argument.lower().endswith(TASKLIST_SUFFIXES):
        raise InputError(f"TaskList file not found: {argument}")
    if path.is_dir():
        raise InputError(f"{argument} is a folder, not a TaskList file")
    return None


def needs_review(request: str, yes: bool) -> bool:
    """A request whose plan must be approved before it runs (a planned one, without --yes)."""
    from merlin_flow.planning.requests import RequestKind, classify

    return not yes and classify(request).kind is RequestKind.PLANNED


def submit_request_here(
    request: str,
    repo: str,
    config: Path | None,
    budget: float | None,
    yes: bool,
    check_tiers: bool = True,
) -> tuple[Database, Settings, RequestSubmission]:
    """Plan the request here (printing that it does), approving it when ``yes``."""
    from merlin_flow.jobs.decisions import user_name
    from merlin_flow.jobs.requesting import submit_request
    from merlin_flow.planning.requests import RequestKind, classify

    settings, db = state()
    kind = classify(request).kind
    doing = {RequestKind.QUESTION: "answering the question", RequestKind.SINGLE: "one step"}
    err_console.print(f"{doing.get(kind, 'planning the request')}…", highlight=False)
    made = submit_request(
        db,
        settings,
        request,
        repo,
        config,
        budget,
        approved_by=user_name() if yes else None,
        check_tiers=check_tiers,
    )
    for warning in made.warnings:
        err_console.print(f"[yellow]warning: {escape(warning)}[/]", highlight=False)
    return db, settings, made


def show_answer(db: Database, job_id: str, as_json: bool) -> None:
    """Print a question's answer (or why there is none); exit 1 without one."""
    from merlin_flow.jobs.views import job_view

    view = job_view(db, job_id)
    if as_json:
        console.print_json(json.dumps(view))
    elif view["answer"] is not None:
        console.print(view["answer"], markup=False, highlight=False)
    else:
        err_console.print(f"[red]job {job_id} failed[/]: {escape(view['error'] or '')}")
    if view["answer"] is None:
        raise typer.Exit(1)


def show_plan(db: Database, job_id: str) -> None:
    """The preview of a job's plan, as `merlin plan` shows it."""
    from merlin_flow.cli.planning import plan_table
    from merlin_flow.config import MerlinConfig
    from merlin_flow.jobs.submission import learned_routes
    from merlin_flow.store import Job
    from merlin_flow.tasklist import TaskList

    with db.reader() as session:
        job = session.get_one(Job, job_id)
        record, config = job.plan or {}, MerlinConfig.model_validate(job.config)
        tasklist = TaskList.model_validate(job.tasklist) if job.tasklist else None
        repo = job.repo
    console.print(plan_table(record, config, tasklist, learned_routes(db, repo, config)))


def describe_request(db: Database, view: JobView) -> None:
    """`merlin status` of a request's job: the request, its plan or answer, the approval."""
    from merlin_flow.store.status import JobStatus

    plan = view["plan"] or {}
    console.print(f"job {view['id']} ({view['status']}): {view['request']}", markup=False)
    if plan.get("kind") == "question":
        console.print("a question, answered read-only (no branch, no commit):")
        console.print(view["answer"] or f"no answer: {view['error']}", markup=False)
        return
    if view["status"] == JobStatus.PLANNING:
        console.print(f"being planned (`merlin resume {view['id']}` plans it again if cut off)")
        return
    if plan.get("fallback"):
        console.print("[yellow]FALLBACK plan[/]: " + escape("; ".join(plan.get("problems", []))))
    if view["status"] == JobStatus.AWAITING_APPROVAL:
        show_plan(db, view["id"])
        console.print(
            f"awaiting approval: `merlin approve {view['id']}` or `merlin reject {view['id']}`"
        )
    elif plan.get("approved_by"):
        edited = " (edited)" if plan.get("edited") else ""
        console.print(f"plan approved by {plan['approved_by']} at {plan['approved_at']}{edited}")
    elif plan.get("rejected_by"):
        console.print(f"plan rejected by {plan['rejected_by']} at {plan['rejected_at']}")


def review(db: Database, settings: Settings, job_id: str) -> bool:
    """Show the plan and ask: approve, edit, reject. True once approved."""
    from merlin_flow.jobs.decisions import reject_job
    from merlin_flow.jobs.requesting import approve_job

    show_plan(db, job_id)
    edited: TaskList | None = None
    while True:
        choice = typer.prompt("approve, edit or reject? [a/e/r]", default="a").strip().lower()
        if choice in ("a", "approve"):
            approve_job(db, settings, job_id, tasklist=edited)
            return True
        if choice in ("r", "reject"):
            reject_job(db, job_id)
            console.print(f"job {job_id} rejected: nothing ran")
            return False
        if choice in ("e", "edit"):
            edited = _edit(db, job_id, edited) or edited
        else:
            err_console.print("answer a (approve), e (edit) or r (reject)")


def _edit(db: Database, job_id: str, edited: TaskList | None) -> TaskList | None:
    """Open the plan's YAML in $EDITOR until it is a valid TaskList; None if unchanged."""
    import click
    import yaml

    from merlin_flow.errors import TaskListError
    from merlin_flow.store import Job
    from merlin_flow.tasklist import load_tasklist

    if edited is not None:
        data = edited.model_dump(mode="json", exclude_defaults=True, exclude_none=True)
    else:
        with db.reader() as session:
            data = dict(session.get_one(Job, job_id).tasklist)
    with tempfile.TemporaryDirectory(prefix="merlin-plan-") as folder:
        path = Path(folder) / f"{job_id}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        while True:
            click.edit(filename=str(path))
            try:
                tasklist = load_tasklist(path)
                tasklist.check_submittable()
            except (TaskListError, InputError) as exc:
                err_console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
                if not typer.confirm("edit again?", default=True):
                    return None
                continue
            console.print(f"edited plan: {len(tasklist.steps)} step(s)")
            return tasklist


def on_a_terminal() -> bool:
    """Whether a person can answer a prompt here."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def approve(
    job_id: JobArg,
    wait: WaitOption = False,
    as_json: JsonOption = False,
) -> None:
    """Approve a planned job's plan: its steps start on the workers."""

    def work() -> None:
        from merlin_flow.cli.following import (
            enqueue,
            finish,
            stop_waiting_on_interrupt,
            warn_if_no_worker,
        )
        from merlin_flow.jobs.requesting import approve_job
        from merlin_flow.store.status import JobStatus

        settings, db = state()
        approve_job(db, settings, job_id)
        enqueue(db, job_id)
        if not as_json:
            console.print(f"job {job_id} approved")
        elif not wait:
            console.print_json(json.dumps({"job_id": job_id, "status": JobStatus.PENDING}))
        if wait:
            with stop_waiting_on_interrupt(job_id):
                finish(db, job_id, as_json)
        else:
            warn_if_no_worker(db)

    guarded(work)


def reject(job_id: JobArg) -> None:
    """Reject a planned job's plan: the job ends as rejected, and nothing runs."""

    def work() -> None:
        from merlin_flow.jobs.decisions import reject_job

        _, db = state()
        reject_job(db, job_id)
        console.print(f"job {job_id} rejected")

    guarded(work)
