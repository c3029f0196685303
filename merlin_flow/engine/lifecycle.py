"""A job's life in the store: events, the step's lease-held writes, ending and closing a job.

Every state change the engine makes that is not an attempt's or a verdict's own work is a
named transition here, so that the attempt (``merlin_flow.engine.attempt``), the verdict
(``merlin_flow.engine.verdict``), cancel and resume (``merlin_flow.jobs.control``) and the recovery
sweep (``merlin_flow.engine.recovery``) write the same rows the same way. Nothing here imports
the agent or the model stack: ``merlin status`` loads only this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig
from merlin_flow.engine.graph import blocked_reason, dependents, is_complete, is_finished, runnable
from merlin_flow.engine.leases import QUEUED, Heartbeat, claim, queued_values, token_tag
from merlin_flow.errors import (
    GitError,
    LeaseLost,
    RemoteUnavailable,
    SandboxUnavailable,
    SetupFailed,
)
from merlin_flow.jobs.reports import job_summary
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    OPEN_ATTEMPT_STATUSES,
    AttemptStatus,
    Database,
    Event,
    Job,
    JobStatus,
    Phase,
    Step,
    StepStatus,
    utcnow,
)
from merlin_flow.workspace.git import diff
from merlin_flow.workspace.repository import JobRepository, repository_of
from merlin_flow.workspace.worktree_cleanup import clear_job

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What the task wrapper does after the work."""

    CONTINUE = "continue"
    """Done; let the chain go on."""
    RETRY = "retry"
    """Verification failed and another attempt is planned: run step + verify again."""
    STOP = "stop"
    """Nothing (more) for this message to do: stop the chain."""


class TaskName(StrEnum):
    """The three tasks a job's chain is made of."""

    STEP = "step"
    VERIFY = "verify"
    FINALIZE = "finalize"


@dataclass(frozen=True)
class PlannedTask:
    """One task of what is left of a job: a step's attempt or verdict, or the finalize."""

    name: TaskName
    step_key: str | None = None
    """The step it works on; None for the finalize."""


@dataclass(frozen=True)
class Dispatch:
    """What the end of a step set in motion: the steps it let start, and the job's end."""

    start: tuple[str, ...] = ()
    """Steps whose dependencies have now all passed, queued for a worker, in file order."""
    finalize: bool = False
    """Every step has finished (or the job ended): the job is to be finalized."""


@dataclass(frozen=True)
class HeldStep:
    """A step this worker holds the lease of (``token``), with what its work needs."""

    db: Database
    settings: Settings
    job_id: str
    step_key: str
    step_id: int
    token: str
    config: MerlinConfig

    def worktree(self, name: str) -> Path:
        """A worktree folder of this job, apart from any other worker's.

        The token keeps apart the worktrees of a worker that lost its lease and of the
        worker that took the step over: neither can delete the other's.
        """
        return self.settings.worktrees_dir / self.job_id / f"{name}-{token_tag(self.token)}"

    def work(self, phase: Phase, work: Callable[[Heartbeat], Outcome]) -> Outcome:
        """Claim the step for ``phase`` and ``work`` it while the lease is renewed.

        A lost lease stops the work (another worker has the step). A fault of the
        project's environment or of this machine, not of the step, fails the job once,
        with the reason, instead of every attempt failing the same way.
        """
        lease = self.config.limits.lease_seconds
        if not claim(self.db, self.step_id, phase, self.token, lease):
            return Outcome.STOP
        try:
            with Heartbeat(self.db, self.step_id, self.token, lease) as heartbeat:
                return work(heartbeat)
        except LeaseLost as exc:
            log.warning("%s", exc)
            return Outcome.STOP
        except (SetupFailed, SandboxUnavailable) as exc:
            fail_job(self.db, self.settings, self.job_id, self.step_key, self.token, str(exc))
            return Outcome.STOP

    def release(self) -> None:
        """End the step's work in a transaction of its own (see ``release_step``)."""
        with self.db.session() as session:
            release_step(session, self.step_id, self.token)


def add_event(
    session: Session,
    job_id: str,
    event: str,
    message: str,
    step_key: str | None = None,
    **data: Any,
) -> None:
    """Append an event to the job's history."""
    session.add(Event(job_id=job_id, step_key=step_key, kind=event, message=message, data=data))


def load_step(session: Session, job_id: str, step_key: str) -> tuple[Job | None, Step | None]:
    """The job and its step ``step_key``; None for either that does not exist."""
    job = session.get(Job, job_id)
    if job is None:
        return None, None
    step = session.scalars(select(Step).where(Step.job_id == job_id, Step.key == step_key)).first()
    return job, step


def lock_job(session: Session, job_id: str) -> Job:
    """The job's row, locked for this transaction (on Postgres; SQLite serializes writers).

    Taken before any step row, as ``cancel_job`` does, so that two transactions never
    wait on each other in opposite orders.
    """
    return session.get_one(Job, job_id, with_for_update=True)


def settle(session: Session, step_id: int, token: str, **values: Any) -> None:
    """Write ``values`` to the step only while ``token`` holds its lease; LeaseLost otherwise.

    With no values it only checks (and row-locks) the lease for the transaction.
    """
    result = session.execute(
        update(Step)
        .where(Step.id == step_id, Step.lease_owner == token)
        .values(**(values or {"lease_owner": token}))
        .execution_options(synchronize_session=False)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(f"step {step_id}: lease taken over by another worker")


def release_step(session: Session, step_id: int, token: str) -> None:
    """The step's work is over (passed, failed, stopped): no phase left, no lease held."""
    settle(session, step_id, token, phase=Phase.DONE, lease_owner=None, lease_expires_at=None)


def hand_off(
    session: Session, step_id: int, token: str, phase: Phase, handoff_seconds: float, **values: Any
) -> None:
    """Queue the step for its next task (``phase``), for the next worker to claim."""
    settle(session, step_id, token, phase=phase, **values, **queued_values(handoff_seconds))


def close_open_attempts(
    step: Step, status: AttemptStatus, now: datetime, reason: str | None = None
) -> None:
    """Give the step's attempts that have no verdict yet (left by a lost worker) ``status``."""
    for attempt in step.attempts:
        if attempt.status in OPEN_ATTEMPT_STATUSES:
            attempt.status = status
            if reason is not None:
                attempt.error = attempt.error or reason
            attempt.finished_at = now


def job_has_ended(db: Database, job_id: str) -> bool:
    """True once the job has a final status (cancelled while its step was running...)."""
    with db.reader() as session:
        return session.scalar(select(Job.status).where(Job.id == job_id)) in FINAL_JOB_STATUSES


def fail_job_in_session(session: Session, job_id: str, step: Step | None, reason: str) -> None:
    """Mark a step (if given) and its job failed, within an open session."""
    end_job_in_session(session, job_id, step, reason, status=JobStatus.FAILED)


def end_job_in_session(
    session: Session, job_id: str, step: Step | None, reason: str, status: JobStatus
) -> None:
    """End a job early (failed, cancelled, budget_exceeded): its step fails, later ones skip."""
    now = utcnow()
    if step is not None:
        step.status = StepStatus.FAILED
        step.error = reason
        step.finished_at = now
        step.phase = Phase.DONE
        close_open_attempts(step, AttemptStatus.ERROR, now, reason)
    job = session.get_one(Job, job_id)
    if job.status not in FINAL_JOB_STATUSES:
        job.status = status
        job.error = reason
        job.updated_at = now
        add_event(session, job_id, f"job_{status}", reason, step.key if step else None)
        for later in job.steps:
            # A step a worker has just claimed is left to it: it stops at its first call.
            if later.status == StepStatus.PENDING and not _held_by_a_worker(later):
                later.status = StepStatus.SKIPPED
                later.result = f"skipped: the job ended ({status}) before this step"
                later.phase = Phase.DONE
                later.lease_owner = later.lease_expires_at = None


def start_runnable(session: Session, job: Job, handoff_seconds: float) -> Dispatch:
    """Queue the steps whose dependencies have all passed; say whether the job finished.

    Called under the job's lock (``lock_job``) when a step ends, so that of two siblings
    ending at once, the second sees both passed and queues the step that needs both.
    """
    limit = MerlinConfig.model_validate(job.config).limits.max_parallel_steps
    started = runnable(job.steps, limit)
    for step in started:
        for key, value in queued_values(handoff_seconds).items():
            setattr(step, key, value)
    finished = is_finished(step.status for step in job.steps)
    return Dispatch(tuple(step.key for step in started), finished)


def fail_step_in_session(session: Session, job: Job, step: Step, reason: str) -> None:
    """A step with ``on_failure: continue`` failed: it fails alone, and what needs it skips."""
    now = utcnow()
    step.status = StepStatus.FAILED
    step.error = reason
    step.finished_at = now
    step.phase = Phase.DONE
    step.lease_owner = step.lease_expires_at = None
    close_open_attempts(step, AttemptStatus.ERROR, now, reason)
    add_event(session, job.id, "step_failed", reason, step.key)
    for later in dependents(job.steps, step.key):
        if later.status not in FINISHED_STEP_STATUSES:
            why = blocked_reason(job.steps, later) or f"needs {step.key}, which failed"
            later.status = StepStatus.SKIPPED
            later.result = f"skipped: {why}"
            later.phase = Phase.DONE
            later.finished_at = now
            later.lease_owner = later.lease_expires_at = None
            add_event(session, job.id, "step_skipped", later.result, later.key)


def fail_job(
    db: Database, settings: Settings, job_id: str, step_key: str | None, token: str, reason: str
) -> bool:
    """Fail a job because of an unexpected error in one of its tasks, and finalize it.

    With a ``step_key``, only while ``token`` holds that step's lease: an error in a
    worker that lost the step must not fail the job another worker now runs. Returns
    whether the job was failed.
    """
    with db.session() as session:
        step = None
        if step_key is not None:
            step = session.scalars(
                select(Step).where(Step.job_id == job_id, Step.key == step_key)
            ).first()
            if step is None or step.lease_owner != token:
                return False
            step.lease_owner = None
            step.lease_expires_at = None
        fail_job_in_session(session, job_id, step, reason)
    finalize_job(db, settings, job_id)
    return True


def finalize_job(db: Database, settings: Settings, job_id: str) -> str | None:
    """Close a job: final status, the patch and summary files, the last event. Idempotent."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None or job.finished_at is not None:
            return job.status if job else None
        location, base, head = job.repo, job.base_commit, job.head_commit
    repository, unreadable = _patch_source(location, settings, job_id, base, head)
    with db.session() as session:
        # FOR UPDATE: on Postgres a concurrent finalize (the task and a sweep) waits here
        # and then sees finished_at set. SQLite writers are serialized by BEGIN IMMEDIATE.
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            return None
        if job.finished_at is not None:
            return job.status
        statuses = [step.status for step in job.steps]
        if job.status not in FINAL_JOB_STATUSES:
            if not is_finished(statuses):
                return job.status  # a stale finalize: steps are still running
            if is_complete(statuses):
                job.status = JobStatus.COMPLETED
            else:
                job.status = JobStatus.PARTIALLY_COMPLETED
                job.error = _not_passed(job)
        elif any(_held_by_a_worker(step) for step in _lock_steps(session, job_id)):
            return job.status  # ended (cancelled) while a worker runs a step: it will finalize
        else:
            _close_unfinished_steps(job)
        patch = settings.jobs_dir / job_id / f"{job_id}.patch"
        patch.parent.mkdir(parents=True, exist_ok=True)
        if repository is None:
            patch.write_text("")
        else:
            repository.have(job_id, job.base_commit, job.head_commit)
            patch.write_text(diff(repository.path, job.base_commit, job.head_commit))
            # What workers killed on this machine left; other machines' sweeps clear theirs.
            clear_job(settings, job_id, repository.path)
        warnings = session.scalars(
            select(Event.message)
            .where(Event.job_id == job_id, Event.kind == "spec_warning")
            .order_by(Event.id)
        ).all()
        patch.with_name("summary.md").write_text(job_summary(job, unreadable, warnings))
        job.patch_path = str(patch)
        job.finished_at = job.updated_at = utcnow()
        add_event(session, job_id, "job_finished", f"job {job.status}", patch=str(patch))
        return job.status


def remaining_tasks(db: Database, job_id: str, only: str | None = None) -> list[list[PlannedTask]]:
    """The messages a job waits for, one list per chain to publish.

    Each step queued for its next task (a ``QUEUED`` lease) gets its attempt and verdict,
    or its verdict alone when its attempt awaits one; a job with nothing left to run gets
    its finalize. ``only`` limits it to one step.
    """
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None or job.finished_at is not None:
            return []
        if job.status in FINAL_JOB_STATUSES or is_finished(step.status for step in job.steps):
            return [[PlannedTask(TaskName.FINALIZE)]]
        chains: list[list[PlannedTask]] = []
        for step in job.steps:
            if step.status in FINISHED_STEP_STATUSES or step.lease_owner != QUEUED:
                continue
            if only is not None and step.key != only:
                continue
            verify = PlannedTask(TaskName.VERIFY, step.key)
            attempt = PlannedTask(TaskName.STEP, step.key)
            chains.append([verify] if step.phase == Phase.VERIFY else [attempt, verify])
        return chains


def _not_passed(job: Job) -> str:
    """Which steps of a finished job did not pass: ``failed: c; skipped: d``."""
    parts = []
    for status, word in ((StepStatus.FAILED, "failed"), (StepStatus.SKIPPED, "skipped")):
        keys = [step.key for step in job.steps if step.status == status]
        if keys:
            parts.append(f"{word}: {', '.join(keys)}")
    return "; ".join(parts)


def _lock_steps(session: Session, job_id: str) -> list[Step]:
    """The job's steps, fresh and locked: a worker's claim (an UPDATE) waits, or is seen."""
    return list(
        session.scalars(
            select(Step)
            .where(Step.job_id == job_id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )


def _held_by_a_worker(step: Step) -> bool:
    owner, expires = step.lease_owner, step.lease_expires_at
    return owner not in (None, QUEUED) and expires is not None and expires > utcnow()


def _close_unfinished_steps(job: Job) -> None:
    """Steps a job left unfinished when it ended (cancelled) are skipped, not run."""
    now = utcnow()
    for step in job.steps:
        if step.status in FINISHED_STEP_STATUSES:
            continue
        step.status = StepStatus.SKIPPED
        step.result = f"skipped: the job ended ({job.status}) before this step finished"
        step.phase = Phase.DONE
        step.finished_at = now
        step.lease_owner = step.lease_expires_at = None
        close_open_attempts(step, AttemptStatus.CANCELLED, now)


def _patch_source(
    location: str, settings: Settings, job_id: str, base: str, head: str
) -> tuple[JobRepository | None, str | None]:
    """The repository to write the patch from, with its commits; or None and why not.

    A remote that does not answer raises (the finalize runs again later); one that
    refuses for good (deleted, no access) must not keep the job from ending.
    """
    try:
        repository = repository_of(location, settings)
        repository.have(job_id, base, head)  # fetched before finalize takes the job's lock
    except RemoteUnavailable:
        raise
    except GitError as exc:
        log.warning("job %s: no patch: %s", job_id, exc)
        return None, str(exc)
    return repository, None
