"""Commands that start work: ``run``, ``submit``, ``resume``, ``replay`` and ``demo``.

Each is thin: the library checks and records (``submission.submit_job``, ``control.resume_job``,
``replay.create_replay``), then the job is enqueued for the workers or worked here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from merlin_flow.cli.approval import (
    NEEDS_APPROVAL,
    YesOption,
    needs_review,
    on_a_terminal,
    review,
    show_answer,
    submit_request_here,
    tasklist_file,
)
from merlin_flow.cli.common import (
    BudgetOption,
    ConfigOption,
    JobArg,
    JsonOption,
    JunitOption,
    PatchOption,
    QuietOption,
    RepoOption,
    TaskListArg,
    WaitOption,
    check_quiet,
    check_report_paths,
    console,
    err_console,
    guarded,
    rule,
    state,
)
from merlin_flow.cli.following import (
    OnInterrupt,
    enqueue,
    finish,
    follow,
    run_embedded,
    show_diff,
    stop_waiting_on_interrupt,
    warn_if_no_worker,
)
from merlin_flow.errors import InputError

if TYPE_CHECKING:
    from merlin_flow.jobs.submission import Submission
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database


def _submit(
    tasklist: Path,
    repo: str,
    config: Path | None,
    budget: float | None,
    works_here: bool = False,
    check_tiers: bool = True,
) -> tuple[Database, str]:
    """Check and record the job (nothing enqueued yet); warn when its sandbox is off.

    Celery is imported first, so that the job's messages follow its commit within ms: the
    recovery sweep takes a step queued long with no message for lost (``recovery.grace``).
    """
    import workers.app  # noqa: F401
    from merlin_flow.jobs.submission import submit_job

    settings, db = state()
    submission = submit_job(
        db, settings, tasklist, repo, config, budget, works_here=works_here, check_tiers=check_tiers
    )
    _warn_when_unconfined(submission)
    return db, submission.job_id


def _warn_when_unconfined(submission: Submission) -> None:
    from merlin_flow.tool_config import SandboxMode
    from merlin_flow.workspace.sandbox import SANDBOX_OFF_WARNING

    if submission.config.sandbox.mode is SandboxMode.NONE:
        err_console.print(f"[yellow]{escape(SANDBOX_OFF_WARNING)}[/]", highlight=False)
    for warning in submission.warnings:
        err_console.print(f"[yellow]warning: {escape(warning)}[/]", highlight=False)


def run(
    tasklist: TaskListArg,
    repo: RepoOption = ".",
    config: ConfigOption = None,
    budget: BudgetOption = None,
    as_json: JsonOption = False,
    junit: JunitOption = None,
    patch: PatchOption = None,
    on_interrupt: Annotated[
        OnInterrupt,
        typer.Option(
            "--on-interrupt",
            help="What Ctrl-C does to the job: cancel it, or detach it for `merlin worker`. "
            "ask: ask on a terminal, cancel elsewhere.",
        ),
    ] = OnInterrupt.ASK,
    yes: YesOption = False,
    quiet: QuietOption = False,
) -> None:
    """Run a TaskList, or a request in plain words, in this process, with live progress.

    A request is planned first (see `merlin plan`) and its plan shown for approval; a
    question is answered and its answer printed. `--quiet` prints only the outcome line.
    """

    def work() -> None:
        from merlin_flow.jobs.submission import check_budget

        check_quiet(quiet, as_json)
        check_report_paths(junit, patch)
        check_budget(budget)
        path = tasklist_file(tasklist)
        if path is not None:
            db, job_id = _submit(path, repo, config, budget, works_here=True)
        else:
            if needs_review(tasklist, yes) and not on_a_terminal():
                raise InputError(NEEDS_APPROVAL)
            from merlin_flow.store.status import JobStatus
            from merlin_flow.workspace.sandbox import check_sandbox

            db, settings, made = submit_request_here(tasklist, repo, config, budget, yes)
            job_id = made.job_id
            if made.status in (JobStatus.COMPLETED, JobStatus.FAILED):
                show_answer(db, job_id, as_json)
                return
            if made.status == JobStatus.AWAITING_APPROVAL and not review(db, settings, job_id):
                raise typer.Exit(1)
            check_sandbox(made.config.sandbox)
        run_embedded(
            db,
            job_id,
            as_json or quiet,
            until=lambda: finish(db, job_id, as_json, junit, patch, workers_here=True, quiet=quiet),
            on_interrupt=on_interrupt,
        )

    guarded(work)


def submit(
    tasklist: TaskListArg,
    repo: RepoOption = ".",
    config: ConfigOption = None,
    budget: BudgetOption = None,
    wait: WaitOption = False,
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
    yes: YesOption = False,
    quiet: QuietOption = False,
) -> None:
    """Enqueue a TaskList, or a request in plain words, for the workers; print the job id.

    A request is planned here first; its job then waits in `awaiting_approval` for
    `merlin approve` (or `--yes` approves it now). A question is answered here.
    For pipelines: `--wait --json` prints the final job as JSON and exits 0 (completed),
    1 (failed, cancelled, budget exceeded, rejected) or 2 (bad input); `--junit` and
    `--patch` write reports when the job ends; `--quiet` the id, then the outcome line.
    """

    def work() -> None:
        check_quiet(quiet, as_json)
        if (junit or patch) and not wait:
            raise InputError("--junit and --patch are written when the job ends: add --wait")
        from merlin_flow.jobs.submission import check_budget

        check_report_paths(junit, patch)
        check_budget(budget)
        path = tasklist_file(tasklist)
        if path is not None:
            db, job_id = _submit(path, repo, config, budget, check_tiers=not workers_hold_keys)
        else:
            from merlin_flow.store.status import JobStatus

            db, _, made = submit_request_here(
                tasklist, repo, config, budget, yes, check_tiers=not workers_hold_keys
            )
            job_id = made.job_id
            if made.status in (JobStatus.COMPLETED, JobStatus.FAILED):
                show_answer(db, job_id, as_json)
                return
            if made.status == JobStatus.AWAITING_APPROVAL:
                _print_waiting(job_id, as_json)
                return
        enqueue(db, job_id)
        if as_json:
            if not wait:
                console.print_json(json.dumps({"job_id": job_id}))
        else:
            console.print(job_id)
        if not wait:
            warn_if_no_worker(db)
        if wait:
            with stop_waiting_on_interrupt(job_id):
                finish(db, job_id, as_json, junit, patch, quiet=quiet)

    guarded(work)


def _plan_again(db: Database, settings: Settings, job_id: str, as_json: bool) -> bool:
    """Resume a job whose planning was cut off: plan it again, replaying the paid calls."""
    from merlin_flow.jobs.requesting import plan_job
    from merlin_flow.jobs.views import job_status
    from merlin_flow.store.status import JobStatus

    if job_status(db, job_id) != JobStatus.PLANNING:
        return False
    status = plan_job(db, settings, job_id)
    if status == JobStatus.AWAITING_APPROVAL:
        _print_waiting(job_id, as_json)
    else:
        show_answer(db, job_id, as_json)
    return True


def _print_waiting(job_id: str, as_json: bool) -> None:
    """A submitted plan waits for approval: say so, with the commands that decide."""
    if as_json:
        from merlin_flow.store.status import JobStatus

        console.print_json(json.dumps({"job_id": job_id, "status": JobStatus.AWAITING_APPROVAL}))
        return
    console.print(job_id)
    err_console.print(
        f"job {job_id} awaits approval of its plan: `merlin status {job_id}` shows it, "
        f"`merlin approve {job_id}` starts it, `merlin reject {job_id}` ends it",
        highlight=False,
    )


def resume(
    job_id: JobArg,
    tier: Annotated[
        str | None,
        typer.Option("--tier", help="Tier for the first unverified step (default: as reached)."),
    ] = None,
    budget: BudgetOption = None,
    exit_command: Annotated[
        str | None,
        typer.Option(
            "--exit-command",
            help="A new exit command for the step the job resumes from (its first "
            "unverified step).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A merlin.toml to run the rest of the job with, instead of the one it was "
            "submitted with (merged over the shipped defaults, as at submission).",
        ),
    ] = None,
    wait: WaitOption = False,
    as_json: JsonOption = False,
) -> None:
    """Continue a failed or cancelled job from its first unverified step, on the workers."""

    def work() -> None:
        from merlin_flow.config import load_config
        from merlin_flow.jobs.control import resume_job
        from merlin_flow.jobs.submission import check_budget

        check_budget(budget)
        settings, db = state()
        if _plan_again(db, settings, job_id, as_json):
            return
        step = resume_job(
            db,
            settings,
            job_id,
            tier=tier,
            budget_usd=budget,
            exit_command=exit_command,
            config=load_config(None, config, settings.home_dir, settings.system_config)
            if config is not None
            else None,
        )
        enqueue(db, job_id)
        if as_json and not wait:
            console.print_json(json.dumps({"job_id": job_id, "step": step}))
        elif not as_json:
            console.print(f"job {job_id} resumed from step {escape(step)}")
        if not wait:
            warn_if_no_worker(db)
        if wait:
            with stop_waiting_on_interrupt(job_id):
                finish(db, job_id, as_json)

    guarded(work)


def replay(
    job_id: Annotated[str, typer.Argument(help="A finished job to replay.")],
    as_json: JsonOption = False,
) -> None:
    """Re-run a finished job offline from its journal, on a new branch, and compare.

    Exit code 0 when the replay reached the same attempts and trees at every step.
    """

    def work() -> None:
        from merlin_flow.cli.cost_tables import replay_table
        from merlin_flow.jobs.replay import compare, create_replay

        settings, db = state()
        replay_id = create_replay(db, settings, job_id)
        report = compare(db, settings, replay_id)
        if report.steps:  # a question (no step) has been answered again already
            until = lambda: follow(db, replay_id, as_json)  # noqa: E731
            run_embedded(db, replay_id, as_json, until=until, on_interrupt=OnInterrupt.CANCEL)
            report = compare(db, settings, replay_id)
        if as_json:
            console.print_json(json.dumps(report.to_json()))
        else:
            if report.steps:
                console.print(replay_table(report))
            verdict = "[green]reproduced[/]" if report.reproduced else "[red]NOT reproduced[/]"
            console.print(
                f"replay {replay_id} of {job_id}: {verdict}; "
                f"{report.identical_requests}/{report.calls} requests identical to the original's"
            )
            if report.original_answer is not None or report.replay_answer is not None:
                console.print(
                    f"answer: {escape(report.replay_answer or '(none)')}", highlight=False
                )
            for line in report.differences:
                console.print(f"  - {escape(line)}", highlight=False)
        if not report.reproduced:
            raise typer.Exit(1)

    guarded(work)


def demo(
    on_workers: Annotated[
        bool,
        typer.Option(
            "--submit",
            help="Give the job to your workers (`merlin worker`) instead of working it "
            "here, and follow it: its two parallel steps then run side by side.",
        ),
    ] = False,
) -> None:
    """Run a bundled 3-step job with scripted models, showing a tier escalation."""

    def work() -> None:
        from merlin_flow.jobs.demo import prepare_demo
        from merlin_flow.jobs.submission import create_job

        settings, db = state()
        demo_repo, tasklist, config = prepare_demo()

        rule("merlin demo")
        console.print(
            "[bold yellow]Models are scripted[/]: offline and deterministic, replaying "
            "examples/demo/*.yaml. The demo shows the workflow (verify, fix, escalate), "
            "not model quality."
        )
        console.print(f"throwaway repository: {demo_repo}")
        job_id = create_job(db, settings, tasklist, demo_repo, config)
        try:
            if on_workers:
                enqueue(db, job_id)
                console.print(f"job {job_id} submitted to the workers")
                warn_if_no_worker(db, job_id)
                with stop_waiting_on_interrupt(job_id):
                    finish(db, job_id, as_json=False)
            else:
                run_embedded(db, job_id, as_json=False)
        finally:
            show_diff(db, job_id)

    guarded(work)
