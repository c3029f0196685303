"""Commands that operate on jobs already submitted: watch, cancel, resume, logs."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.app import (
    BudgetOption,
    JsonOption,
    _finish,
    _guarded,
    _state,
    app,
    console,
)

JobArg = Annotated[str, typer.Argument(help="The job id.")]


@app.command()
def watch(job_id: JobArg) -> None:
    """Follow a job live (steps, status, tier, attempt, elapsed) until it ends.

    Exit code 0 when it completed, 1 when it failed, was cancelled or ran out of budget.
    """

    def work() -> None:
        from merlin_flow.jobs import job_status

        _, db = _state()
        job_status(db, job_id)  # an unknown job is an input error before anything is drawn
        _finish(db, job_id, as_json=False)

    _guarded(work)


@app.command()
def cancel(job_id: JobArg) -> None:
    """Cancel a job: pending steps never start, the running step stops at its next turn."""

    def work() -> None:
        from merlin_flow.control import cancel_job
        from merlin_flow.jobs import job_view

        settings, db = _state()
        cancel_job(db, settings, job_id)
        view = job_view(db, job_id)
        if view["finished_at"] is None:
            console.print(
                f"job {job_id} cancelled; its running step stops at its next model or tool "
                "call (`merlin watch` shows when)"
            )
        else:
            console.print(f"job {job_id} cancelled; branch {view['branch']} kept as it was")

    _guarded(work)


@app.command()
def resume(
    job_id: JobArg,
    tier: Annotated[
        str | None,
        typer.Option("--tier", help="Tier for the first unverified step (default: as reached)."),
    ] = None,
    budget: BudgetOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Block until the job ends.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Continue a failed or cancelled job from its first unverified step, on the workers."""

    def work() -> None:
        from merlin_flow.control import resume_job
        from merlin_flow.workflow import enqueue_job
        from workers.app import app as celery_app

        settings, db = _state()
        step = resume_job(db, settings, job_id, tier=tier, budget_usd=budget)
        celery_app.set_default()
        enqueue_job(db, job_id)
        if as_json and not wait:
            console.print_json(json.dumps({"job_id": job_id, "step": step}))
        elif not as_json:
            console.print(f"job {job_id} resumed from step {escape(step)}")
        if wait:
            _finish(db, job_id, as_json)

    _guarded(work)


@app.command()
def logs(
    job_id: JobArg,
    step: Annotated[str | None, typer.Option("--step", help="Only this step (its id).")] = None,
    as_json: JsonOption = False,
) -> None:
    """The agent transcript and exit command output of every attempt of a job."""

    def work() -> None:
        from merlin_flow.cli.render import attempt_log
        from merlin_flow.jobs import job_logs

        _, db = _state()
        entries = job_logs(db, job_id, step)
        if as_json:
            console.print_json(json.dumps(entries))
            return
        if not entries:
            console.print(f"job {job_id}: no attempt has started yet")
        for entry in entries:
            console.print(attempt_log(entry))

    _guarded(work)
