"""Reading jobs back: the views ``status``, ``list``, ``logs`` and ``watch`` print.

Each view is JSON-ready data (what ``--json`` prints, documented in docs/reference.md).
Creating a job is ``merlin_flow.jobs.submission``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session, load_only, selectinload

from merlin_flow.errors import JobNotFoundError
from merlin_flow.failures import AttemptKind
from merlin_flow.jobs.costs import UNPRICED, CostFields, cost_fields
from merlin_flow.store import Attempt, Database, Event, Job, LlmCall, Step
from merlin_flow.store.events import EventKind
from merlin_flow.store.status import AttemptStatus, JobStatus, StepStatus

if TYPE_CHECKING:
    from merlin_flow.jobs.evidence import FailureView
    from merlin_flow.settings import Settings

# What only a full view or a diff needs is imported where used: `list` reads jobs alone.


class AttemptView(CostFields):
    """One attempt, as ``merlin status --json`` shows it."""

    number: int
    kind: AttemptKind
    tier: str
    model: str
    status: AttemptStatus
    commit: str | None
    exit_code: int | None
    error: str | None
    output_tail: str | None
    summary: str | None
    turns: int | None
    runs: int
    prompt_tokens: int
    completion_tokens: int
    started_at: str | None
    finished_at: str | None


class StepView(TypedDict):
    """One step of a job view."""

    id: str
    step_type: str
    description: str
    status: StepStatus
    tier: str | None
    complexity: str | None
    route: dict[str, Any] | None
    """Where the step started and on what evidence (``planning.route_learning``)."""
    exit_command: str
    depends_on: list[str]
    """The steps that must pass before this one starts (a plain list: the one before)."""
    waiting_on: list[str]
    """Of those, the ones that have not passed yet."""
    on_failure: str
    """``stop`` or ``continue``: what this step's failure does to the job."""
    agent: str | None
    """The step's agent (None: merlin's plain coding agent)."""
    agent_choice: str | None
    """How it was chosen: ``named``, ``default`` or ``autodelegated``."""
    agent_score: float | None
    """For an autodelegated agent, its match score (``[agents] min_score``)."""
    error: str | None
    result: str | None
    """What the step did; for a skipped step, why it was skipped."""
    started_at: str | None
    finished_at: str | None
    deliveries: int
    recoveries: int
    attempts: list[AttemptView]


class JobView(CostFields):
    """A whole job: what ``merlin status --json`` prints (docs/reference.md)."""

    id: str
    title: str
    repo: str
    status: JobStatus
    branch: str | None
    """The job branch, `merlin/<job>`; None while it does not exist (a request before
    its approval, a question)."""
    base_commit: str
    head_commit: str
    error: str | None
    budget_usd: float | None
    replay_of: str | None
    patch: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    progress: dict[str, int]
    finished: bool
    """Every step passed, failed or was skipped."""
    complete: bool
    """Every step passed."""
    steps: list[StepView]
    request: str | None
    """The request in plain words the job was made from (None for a TaskList's)."""
    plan: dict[str, Any] | None
    """How the request was planned and approved (``requesting.plan_record``)."""
    answer: str | None
    """A question's answer."""
    failure: FailureView | None
    """Why the job failed, when a step failed: ``merlin status --json``'s evidence."""


class JobListEntry(CostFields):
    """One job of ``merlin list --json`` (and of the dashboard's jobs page)."""

    id: str
    status: JobStatus
    title: str
    repo: str
    branch: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    steps_done: int
    steps_total: int
    tier: str | None
    budget_usd: float | None


class EventView(TypedDict):
    """One event of a job's history."""

    id: int
    kind: EventKind
    step_key: str | None
    message: str
    data: dict[str, Any] | None
    created_at: str | None


def iso_utc(value: datetime | None) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with `Z`, as every view writes times."""
    return value.isoformat(timespec="seconds") + "Z" if value else None


def attempt_view(attempt: Attempt, unpriced_calls: int = 0) -> AttemptView:
    """One attempt as JSON-ready data (its cost is unknown when calls were unpriced)."""
    return {
        "number": attempt.number,
        "kind": AttemptKind(attempt.kind),
        "tier": attempt.tier,
        "model": attempt.model,
        "status": AttemptStatus(attempt.status),
        "commit": attempt.commit,
        "exit_code": attempt.exit_code,
        "error": attempt.error,
        "output_tail": attempt.output_tail,
        "summary": attempt.summary,
        "turns": attempt.turns,
        "runs": attempt.runs,
        "prompt_tokens": attempt.prompt_tokens,
        "completion_tokens": attempt.completion_tokens,
        "started_at": iso_utc(attempt.started_at),
        "finished_at": iso_utc(attempt.finished_at),
        **cost_fields(attempt.cost_usd, unpriced_calls),
    }


def job_view(db: Database, job_id: str) -> JobView:
    """The full state of a job: what ``merlin status --json`` prints."""
    from merlin_flow.engine.graph import is_complete, is_finished, waiting_on
    from merlin_flow.jobs.evidence import failure_view

    # Steps and attempts in two queries, not one per step, without the transcripts,
    # which the view does not show (``merlin logs`` does): a job of 200 attempts reads
    # megabytes less.
    loading = selectinload(Job.steps).selectinload(Step.attempts).defer(Attempt.transcript)
    with db.reader() as session:
        job = session.get(Job, job_id, options=[loading])
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        cost = session.scalar(
            select(func.coalesce(func.sum(LlmCall.cost_usd), 0.0)).where(LlmCall.job_id == job_id)
        )
        unpriced = dict(
            session.execute(
                select(LlmCall.attempt_id, func.count())
                .where(LlmCall.job_id == job_id, *UNPRICED)
                .group_by(LlmCall.attempt_id)
            ).all()
        )
        tiers = [tier["name"] for tier in job.config.get("tiers", [])]
        steps: list[StepView] = []
        for step in job.steps:
            steps.append(
                {
                    "id": step.key,
                    "step_type": step.step_type,
                    "description": step.description,
                    "status": StepStatus(step.status),
                    "tier": tiers[step.tier_index] if step.tier_index < len(tiers) else None,
                    "complexity": step.complexity,
                    "route": step.route,
                    "exit_command": step.exit_command,
                    "depends_on": list(step.depends_on or []),
                    "waiting_on": waiting_on(job.steps, step),
                    "on_failure": step.on_failure,
                    "agent": step.agent,
                    "agent_choice": step.agent_choice,
                    "agent_score": step.agent_score,
                    "error": step.error,
                    "result": step.result,
                    "started_at": iso_utc(step.started_at),
                    "finished_at": iso_utc(step.finished_at),
                    "deliveries": step.deliveries,
                    "recoveries": step.recoveries,
                    "attempts": [attempt_view(a, unpriced.get(a.id, 0)) for a in step.attempts],
                }
            )
        counts = {status.value: 0 for status in StepStatus}
        for step in job.steps:
            counts[step.status] += 1
        return {
            "id": job.id,
            "title": job.title,
            "repo": job.repo,
            "status": JobStatus(job.status),
            "branch": made_branch(job),
            "base_commit": job.base_commit,
            "head_commit": job.head_commit,
            "error": job.error,
            **cost_fields(float(cost or 0.0), sum(unpriced.values())),
            "budget_usd": job.budget_usd,
            "replay_of": job.replay_of,
            "patch": job.patch_path,
            "created_at": iso_utc(job.created_at),
            "started_at": iso_utc(job.started_at),
            "finished_at": iso_utc(job.finished_at),
            "progress": {"total": len(job.steps), **counts},
            "finished": bool(job.steps) and is_finished(step.status for step in job.steps),
            "complete": bool(job.steps) and is_complete(step.status for step in job.steps),
            "steps": steps,
            "request": job.request,
            "plan": job.plan,
            "answer": job.answer,
            "failure": failure_view(job.steps),
        }


def made_branch(job: Job) -> str | None:
    """The job's branch once made: at submission, or at a request's approval (else None)."""
    if job.request is None or (job.plan or {}).get("approved_at"):
        return job.branch
    return None


def list_jobs(
    db: Database,
    limit: int = 50,
    statuses: Collection[JobStatus] = (),
    repo: str | None = None,
    since: datetime | None = None,
    before: str | None = None,
) -> list[JobListEntry]:
    """The ``limit`` newest jobs, newest first: ``merlin list`` and the dashboard.

    Only those of ``statuses`` (if given), of repository ``repo``, created at or after
    ``since``, and older than job ``before`` (the last of the previous page). A job's
    steps, tier and cost are read for the whole page at once: four queries in all.
    """
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if statuses:
        query = query.where(Job.status.in_([status.value for status in statuses]))
    if repo is not None:
        query = query.where(Job.repo == repo)
    if since is not None:
        query = query.where(Job.created_at >= since)
    with db.reader() as session:
        if before is not None:
            cursor = session.get(Job, before)
            if cursor is None:
                raise JobNotFoundError(f"no job with id {before!r}")
            query = query.where(
                (Job.created_at < cursor.created_at)
                | ((Job.created_at == cursor.created_at) & (Job.id < cursor.id))
            )
        jobs = session.scalars(query.options(load_only(*_LISTED))).all()
        figures = _page_figures(session, [job.id for job in jobs])
        return [
            {
                **figures[job.id],
                "id": job.id,
                "status": JobStatus(job.status),
                "title": job.title,
                "repo": job.repo,
                "branch": made_branch(job),
                "created_at": iso_utc(job.created_at),
                "started_at": iso_utc(job.started_at),
                "finished_at": iso_utc(job.finished_at),
                "budget_usd": job.budget_usd,
            }
            for job in jobs
        ]


_LISTED = (Job.id, Job.status, Job.title, Job.repo, Job.branch, Job.request, Job.plan,
           Job.created_at, Job.started_at, Job.finished_at, Job.budget_usd)  # fmt: skip
"""The columns a list reads (not the TaskList and configuration a job carries)."""


class _Figures(CostFields):
    steps_done: int
    steps_total: int
    tier: str | None


def _page_figures(session: Session, ids: list[str]) -> dict[str, _Figures]:
    """Per job of ``ids``: steps passed and in all, the tier of its latest attempt, cost."""
    done = func.sum(case((Step.status == StepStatus.COMPLETED.value, 1), else_=0))
    steps = session.execute(
        select(Step.job_id, done, func.count()).where(Step.job_id.in_(ids)).group_by(Step.job_id)
    ).all()
    latest = (
        select(func.max(Attempt.id))
        .join(Step, Attempt.step_id == Step.id)
        .where(Step.job_id.in_(ids))
        .group_by(Step.job_id)
    )
    tiers = session.execute(
        select(Step.job_id, Attempt.tier)
        .join(Step, Attempt.step_id == Step.id)
        .where(Attempt.id.in_(latest))
    ).all()
    unpriced = func.sum(case((and_(*UNPRICED), 1), else_=0))
    costs = session.execute(
        select(LlmCall.job_id, func.coalesce(func.sum(LlmCall.cost_usd), 0.0), unpriced)
        .where(LlmCall.job_id.in_(ids))
        .group_by(LlmCall.job_id)
    ).all()
    figures: dict[str, _Figures] = {
        job: {"steps_done": 0, "steps_total": 0, "tier": None, **cost_fields(0.0, 0)} for job in ids
    }
    for job, passed, total in steps:
        figures[job]["steps_done"], figures[job]["steps_total"] = int(passed or 0), int(total)
    for job, tier in tiers:
        figures[job]["tier"] = tier
    for job, known, missing in costs:
        figures[job] = {**figures[job], **cost_fields(float(known or 0.0), int(missing or 0))}
    return figures


def job_status(db: Database, job_id: str) -> JobStatus:
    """Just the status of a job."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        return JobStatus(job.status)


def events_since(db: Database, job_id: str, after_id: int = 0) -> list[EventView]:
    """The job's events with an id above ``after_id``, oldest first."""
    with db.reader() as session:
        rows = session.scalars(
            select(Event).where(Event.job_id == job_id, Event.id > after_id).order_by(Event.id)
        ).all()
        return [
            {
                "id": row.id,
                "kind": EventKind(row.kind),
                "step_key": row.step_key,
                "message": row.message,
                "data": row.data,
                "created_at": iso_utc(row.created_at),
            }
            for row in rows
        ]


def job_diff(db: Database, settings: Settings, job_id: str) -> bytes:
    """The patch of the job's branch so far (git's bytes, binary files included)."""
    from merlin_flow.workspace.git import patch_bytes
    from merlin_flow.workspace.repository import repository_of

    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        location, base, head = job.repo, job.base_commit, job.head_commit
    repository = repository_of(location, settings)
    repository.have(job_id, base, head)
    return patch_bytes(repository.path, base, head)
