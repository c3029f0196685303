"""Operating on running jobs: ``merlin cancel`` and ``merlin resume``.

Cancelling marks the job ``cancelled`` in one transaction; pending steps never start.
A worker running a step sees the status at its next model call or tool call (or after
its exit command) and stops without moving the job branch; then the job is finalized.
A job nobody is working on is finalized at once.

Resuming puts a failed, cancelled, budget-stopped, parked or partially completed job back in
motion: every step that did not pass is pending again, and those whose dependencies
have passed are queued (``lifecycle.reopen_job``). The first of them starts afresh
from the branch's head, on the tier it had reached (or ``--tier``), with its earlier
failures as feedback; the others keep their tiers. Completed steps are kept. A resume
may correct what made the job fail: the first step's exit command (``--exit-command``)
or the whole configuration (``--config``; each unfinished step keeps its tier where
the new configuration has a tier of that name, and is routed afresh where it has not).
"""

from __future__ import annotations

from sqlalchemy import select

from merlin_flow.config import MerlinConfig
from merlin_flow.engine.budget import require_priced_tiers
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.lifecycle import end_job, reopen_job
from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.jobs.submission import check_budget
from merlin_flow.models.credentials import require_a_usable_tier
from merlin_flow.models.endpoints import pin_endpoints
from merlin_flow.planning.routing import start_tier
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    RESUMABLE_JOB_STATUSES,
    Database,
    Job,
    JobStatus,
    Step,
    StepStatus,
)
from merlin_flow.store.events import EventKind, add_event
from merlin_flow.tasklist import StepType, TaskList
from merlin_flow.workspace.exit_commands import refuse_shell_syntax
from merlin_flow.workspace.repository import repository_of


def cancel_job(db: Database, settings: Settings, job_id: str) -> str:
    """Cancel ``job_id``; its status afterwards (``cancelled`` once finalized)."""
    with db.session() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        if job.status in FINAL_JOB_STATUSES:
            raise InputError(f"job {job_id} has already ended ({job.status}); nothing to cancel")
        if all(step.status == StepStatus.COMPLETED for step in job.steps):
            raise InputError(f"job {job_id}: every step has passed; it is being finalized")
        end_job(session, job_id, None, "cancelled on request", JobStatus.CANCELLED)
    finalize_job(db, settings, job_id)  # waits for a worker that holds a step (see there)
    return JobStatus.CANCELLED


def resume_job(
    db: Database,
    settings: Settings,
    job_id: str,
    tier: str | None = None,
    budget_usd: float | None = None,
    *,
    exit_command: str | None = None,
    config: MerlinConfig | None = None,
    check_tiers: bool = True,
) -> str:
    """Reopen a failed or cancelled job from its first unverified step; returns that step.

    ``exit_command`` replaces that step's exit command; ``config`` replaces the job's
    configuration (its endpoints pinned as at submission; ``check_tiers`` refuses one
    with no usable tier from here). The caller enqueues the job (``canvas.enqueue_job``).
    """
    check_budget(budget_usd)
    if exit_command is not None and not exit_command.strip():
        raise InputError("--exit-command is empty: give the command that verifies the step")
    if config is not None:
        config = pin_endpoints(config)
        if check_tiers:
            require_a_usable_tier(config)
    with db.reader() as session:
        known = session.get(Job, job_id)
        location, branch = (known.repo, known.branch) if known else (None, None)
    # Read before taking the job's lock: for a git URL this asks the remote.
    head = repository_of(location, settings).branch_head(branch) if location and branch else None
    with db.session() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        if job.status not in RESUMABLE_JOB_STATUSES or job.finished_at is None:
            raise InputError(
                f"job {job_id} is {job.status}; only a failed, cancelled, budget_exceeded, "
                "parked or partially_completed job that has ended can be resumed"
            )
        if job.status == JobStatus.BUDGET_EXCEEDED and budget_usd is None:
            raise InputError(
                f"job {job_id} ran out of its budget (${job.budget_usd or 0:.4f}); "
                "resume it with a larger --budget"
            )
        old_config = MerlinConfig.model_validate(job.config)
        new_config = config or old_config
        tasklist = TaskList.model_validate(job.tasklist)
        budget = budget_usd if budget_usd is not None else job.budget_usd
        require_priced_tiers(new_config, tasklist, budget)
        tier_index = new_config.tier_index(tier) if tier is not None else None
        if head != job.head_commit:
            raise InputError(
                f"job branch {job.branch} is no longer at {job.head_commit[:10]} (someone "
                "moved or deleted it); cannot resume on top of it"
            )
        steps = session.scalars(
            select(Step).where(Step.job_id == job_id).order_by(Step.position)
        ).all()
        todo = [step for step in steps if step.status != StepStatus.COMPLETED]
        if not todo:
            raise InputError(f"job {job_id}: every step already passed; nothing to resume")
        first = todo[0]
        if tier_index is not None and not new_config.tiers[tier_index].serves(
            StepType(first.step_type)
        ):
            raise InputError(f"tier {tier!r} does not take {first.step_type} steps (step_types)")
        if config is not None:
            _carry_tiers(todo, old_config, new_config, tasklist)
            job.config = new_config.model_dump(mode="json")
        changes = _changes(first, exit_command, new_config if config is not None else None)
        if exit_command is not None:
            refuse_shell_syntax(exit_command, new_config.shell, "--exit-command")
            first.exit_command = exit_command
        if tier_index is not None:
            first.tier_index = tier_index
        started = reopen_job(session, job, todo, settings.handoff_seconds).start
        if budget_usd is not None:
            job.budget_usd = budget_usd
        tier_name = new_config.tiers[first.tier_index].name
        add_event(
            session,
            job_id,
            EventKind.JOB_RESUMED,
            f"job resumed from step {first.key} on tier {tier_name}{changes}",
            first.key,
            {"tier": tier_name, "started": list(started)},
        )
        return first.key


def _carry_tiers(
    steps: list[Step], old: MerlinConfig, new: MerlinConfig, tasklist: TaskList
) -> None:
    """Move each step to the new configuration's tier of the same name, else route it."""
    by_key = {step.id: step for step in tasklist.steps}
    names = [tier.name for tier in new.tiers]
    for step in steps:
        name = old.tiers[step.tier_index].name if step.tier_index < len(old.tiers) else None
        if name in names and new.tiers[names.index(name)].serves(StepType(step.step_type)):
            step.tier_index = names.index(name)
        else:
            step.tier_index = start_tier(by_key[step.key], new)[0]


def _changes(first: Step, exit_command: str | None, config: MerlinConfig | None) -> str:
    """What the resume corrects, for its event: ``; exit command `x` (was `y`)...``."""
    parts = []
    if exit_command is not None and exit_command != first.exit_command:
        parts.append(f"exit command `{exit_command}` (was `{first.exit_command}`)")
    if config is not None:
        parts.append(f"configuration from {config.source or 'the defaults'}")
    return "".join(f"; {part}" for part in parts)
