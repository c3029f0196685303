"""Every status change of a job, a step or an attempt, each a named transition.

A transition is a function named for what happens (``start_step``, ``pass_step``,
``end_job``...) that writes the status, the columns that go with it and the event that
records it, in the caller's transaction. It applies only to a row in one of the states
it names; for any other it raises ``TransitionRefused`` and nothing is written, unless
it says it is a no-op there (``start_job`` on a running job). No other module writes a
``status``: the attempt and verdict tasks (``merlin_flow.engine.attempt``,
``merlin_flow.engine.verdict``), the recovery sweep, finalize, and the use cases (submit,
plan, approve, cancel, resume) all change states here. Rows are created in their first
state where they are made (a job ``pending`` or ``planning``, a step ``Pending``, an
attempt ``running``).

Callers hold the job's row lock (``held_step.lock_job``) where two writers of one job
could race (a verdict and a cancel, two siblings ending); a worker's writes are also
conditional on its lease (``merlin_flow.engine.leases``), checked first in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from merlin_flow.engine.dispatch import Dispatch, start_runnable
from merlin_flow.engine.graph import blocked_reason, dependents, is_complete, is_finished
from merlin_flow.engine.leases import QUEUED
from merlin_flow.errors import TransitionRefused
from merlin_flow.failures import AttemptKind, FailureKind
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    OPEN_ATTEMPT_STATUSES,
    RESUMABLE_JOB_STATUSES,
    Attempt,
    AttemptStatus,
    Job,
    JobStatus,
    Phase,
    Step,
    StepStatus,
    utcnow,
)
from merlin_flow.store.events import JOB_ENDED, EventData, EventKind, IntegratedData, add_event
from merlin_flow.workspace.sandbox import SANDBOX_OFF_WARNING

EARLY_ENDS = frozenset(JOB_ENDED)
"""The statuses a job ends with before all its steps finished."""


VERIFIED = frozenset({AttemptStatus.COMMITTED, AttemptStatus.PASSED, AttemptStatus.FAILED})
"""What an attempt may be when its verdict is recorded (again, after a lost write)."""


def _expect(what: str, status: str, allowed: Iterable[str]) -> None:
    """TransitionRefused unless ``status`` is one ``what`` applies to."""
    allowed = frozenset(allowed)
    if status not in allowed:
        raise TransitionRefused(
            f"{what} applies to {' or '.join(sorted(allowed))}, not to {status}"
        )


# -- a request's job, before its steps exist ---------------------------------------------


def record_answer(session: Session, job: Job, answer: str | None, error: str | None) -> None:
    """Planning -> completed (answered) or failed (no answer): a question's job ends."""
    _expect("record_answer", job.status, {JobStatus.PLANNING})
    job.answer = answer
    job.status = JobStatus.COMPLETED if error is None else JobStatus.FAILED
    job.error = error
    job.finished_at = utcnow()
    add_event(session, job.id, EventKind.QUESTION_ANSWERED, error or "question answered")


def await_approval(session: Session, job: Job, how: str) -> None:
    """Planning -> awaiting_approval: the plan (``how``: its kind and size) waits."""
    _expect("await_approval", job.status, {JobStatus.PLANNING})
    job.status = JobStatus.AWAITING_APPROVAL
    add_event(session, job.id, EventKind.PLAN_READY, f"{how}: waiting for approval")


def approve_plan(session: Session, job: Job, who: str, edited: bool) -> None:
    """awaiting_approval -> pending: the plan is accepted; its steps may start."""
    _expect("approve_plan", job.status, {JobStatus.AWAITING_APPROVAL})
    job.status = JobStatus.PENDING
    note = " (edited)" if edited else ""
    add_event(session, job.id, EventKind.PLAN_APPROVED, f"plan approved by {who}{note}")


def reject_plan(session: Session, job: Job, who: str) -> None:
    """awaiting_approval -> rejected: no step runs."""
    _expect("reject_plan", job.status, {JobStatus.AWAITING_APPROVAL})
    job.status = JobStatus.REJECTED
    job.finished_at = utcnow()
    add_event(session, job.id, EventKind.PLAN_REJECTED, f"plan rejected by {who}")


# -- a job's steps and attempts while it runs ---------------------------------------------


def start_job(session: Session, job: Job, *, sandboxed: bool) -> None:
    """Pending -> running, at its first attempt; a no-op for a job already running."""
    if job.status != JobStatus.PENDING:
        return
    job.status = JobStatus.RUNNING
    job.started_at = utcnow()
    add_event(session, job.id, EventKind.JOB_STARTED, "job started")
    if not sandboxed:
        add_event(session, job.id, EventKind.SANDBOX_DISABLED, SANDBOX_OFF_WARNING)


def start_step(session: Session, job: Job, step: Step) -> None:
    """Pending -> InProgress, from the job branch's head; a no-op for a step under way."""
    if step.status != StepStatus.PENDING:
        return
    step.status = StepStatus.IN_PROGRESS
    step.started_at = utcnow()
    step.base_commit = job.head_commit
    add_event(session, job.id, EventKind.STEP_STARTED, f"step {step.key} started", step.key)


def end_attempt(
    session: Session,
    job_id: str,
    step_key: str,
    attempt: Attempt,
    error: str | None,
    failure: FailureKind | None,
    *,
    job_ended: bool,
) -> None:
    """Running -> committed (its commit awaits verification), error, or cancelled.

    ``error``: the attempt could not finish (``failure`` says why); ``job_ended``: its
    job ended meanwhile, and the attempt is kept for the record, verified by nobody.
    """
    _expect("end_attempt", attempt.status, {AttemptStatus.RUNNING})
    attempt.status = AttemptStatus.ERROR if error else AttemptStatus.COMMITTED
    attempt.error = error
    attempt.failure_kind = failure if error else None
    if job_ended:
        attempt.status = AttemptStatus.CANCELLED
    if error or job_ended:
        attempt.finished_at = utcnow()
    outcome = f"failed: {error}" if error else f"committed {(attempt.commit or '')[:10]}"
    add_event(
        session,
        job_id,
        EventKind.ATTEMPT_ERROR if error else EventKind.ATTEMPT_COMMITTED,
        f"attempt {attempt.number} {outcome}",
        step_key,
        {"attempt": attempt.number},
    )


def stop_for_budget(
    session: Session, job_id: str, step: Step, attempt: Attempt, reason: str
) -> None:
    """Running attempt -> error, and its job -> budget_exceeded: no more calls are paid."""
    _expect("stop_for_budget", attempt.status, {AttemptStatus.RUNNING})
    attempt.status = AttemptStatus.ERROR
    attempt.error = reason
    attempt.failure_kind = FailureKind.BUDGET
    attempt.finished_at = utcnow()
    end_job(session, job_id, step, reason, JobStatus.BUDGET_EXCEEDED)


def fail_attempt(attempt: Attempt) -> None:
    """Committed -> failed: its exit command, spec check or integration failed.

    An attempt in error (its agent could not finish) stays in error, with its reason.
    """
    _expect("fail_attempt", attempt.status, {*VERIFIED, AttemptStatus.ERROR})
    if attempt.status != AttemptStatus.ERROR:
        attempt.status = AttemptStatus.FAILED
        attempt.failure_kind = FailureKind.CAPABILITY


def cancel_attempt(attempt: Attempt) -> None:
    """Committed -> cancelled: it passed, but its job ended before the branch moved."""
    _expect("cancel_attempt", attempt.status, VERIFIED)
    attempt.status = AttemptStatus.CANCELLED


def pass_step(
    session: Session,
    job: Job,
    step: Step,
    attempt: Attempt,
    head: str,
    handoff_seconds: float,
    integrated: IntegratedData | None = None,
) -> Dispatch:
    """InProgress -> Completed with its attempt passed; the job branch is at ``head``.

    ``integrated``: the step was merged onto a branch its siblings moved, and verified
    again. Queues the steps its pass lets start (``Dispatch``).
    """
    _expect("pass_step", step.status, {StepStatus.IN_PROGRESS})
    _expect("pass_step", attempt.status, {AttemptStatus.COMMITTED, AttemptStatus.PASSED})
    now = utcnow()
    attempt.status = AttemptStatus.PASSED
    step.status = StepStatus.COMPLETED
    step.result = attempt.summary or f"verified by `{step.exit_command}`"
    step.error = None
    step.finished_at = now
    job.head_commit = head
    job.updated_at = now
    if integrated is not None:
        commands = ", ".join(f"`{command}`" for command in integrated["commands"])
        message = (
            f"step {step.key} merged onto {integrated['onto'][:10]} and verified again by "
            f"{commands}"
        )
        add_event(session, job.id, EventKind.STEP_INTEGRATED, message, step.key, integrated)
    message = f"step {step.key} passed on tier {attempt.tier}"
    add_event(session, job.id, EventKind.STEP_COMPLETED, message, step.key)
    return start_runnable(session, job, handoff_seconds)


def fail_step(session: Session, job: Job, step: Step, reason: str) -> None:
    """InProgress -> Failed alone (``on_failure: continue``); what needs it is Skipped."""
    _expect("fail_step", step.status, {StepStatus.IN_PROGRESS})
    now = utcnow()
    _fail(step, reason, now)
    step.lease_owner = step.lease_expires_at = None
    add_event(session, job.id, EventKind.STEP_FAILED, reason, step.key)
    for later in dependents(job.steps, step.key):
        if later.status not in FINISHED_STEP_STATUSES:
            why = blocked_reason(job.steps, later) or f"needs {step.key}, which failed"
            _skip(later, f"skipped: {why}", now)
            add_event(session, job.id, EventKind.STEP_SKIPPED, later.result or "", later.key)


def end_job(
    session: Session,
    job_id: str,
    step: Step | None,
    reason: str,
    status: JobStatus,
    data: EventData | None = None,
) -> None:
    """A job ends early (failed, cancelled, budget_exceeded, parked): its step ends, later skip.

    ``data`` goes with the job's event (a parked job's ``ParkedData``). The step (if
    given) fails, or is parked, whatever the job's state; a job already ended keeps its
    status. Pending steps are skipped, but one a worker has just claimed is left to it:
    it stops at its first call.
    """
    _expect("end_job", status, EARLY_ENDS)
    now = utcnow()
    if step is not None:
        parked = status == JobStatus.PARKED
        _fail(step, reason, now, StepStatus.PARKED if parked else StepStatus.FAILED)
    job = session.get_one(Job, job_id)
    if job.status in FINAL_JOB_STATUSES:
        return
    job.status = status
    job.error = reason
    job.updated_at = now
    add_event(session, job_id, JOB_ENDED[status], reason, step.key if step else None, data)
    for later in job.steps:
        if later.status == StepStatus.PENDING and not held_by_a_worker(later):
            _skip(later, f"skipped: the job ended ({status}) before this step", None)


def close_job(session: Session, job: Job) -> bool:
    """A job's final status, when it can be closed; False when it cannot yet.

    Every step finished: completed, or partially_completed naming the steps that did not
    pass. Ended early (cancelled...): its unfinished steps are skipped, unless a worker
    still runs one (that worker closes the job). Steps still to run: not yet.
    """
    statuses = [step.status for step in job.steps]
    if job.status not in FINAL_JOB_STATUSES:
        if not is_finished(statuses):
            return False
        if is_complete(statuses):
            job.status = JobStatus.COMPLETED
        else:
            job.status = JobStatus.PARTIALLY_COMPLETED
            job.error = _not_passed(job)
        return True
    if any(held_by_a_worker(step) for step in _lock_steps(session, job.id)):
        return False
    now = utcnow()
    for step in job.steps:
        if step.status not in FINISHED_STEP_STATUSES:
            reason = f"skipped: the job ended ({job.status}) before this step finished"
            _skip(step, reason, now)
            close_open_attempts(step, AttemptStatus.CANCELLED, now)
    return True


def finish_job(session: Session, job: Job, patch: str) -> None:
    """The closed job's last write: its patch file, and the time it finished."""
    _expect("finish_job", job.status, FINAL_JOB_STATUSES)
    job.patch_path = patch
    job.finished_at = job.updated_at = utcnow()
    add_event(session, job.id, EventKind.JOB_FINISHED, f"job {job.status}", data={"patch": patch})


def reopen_job(session: Session, job: Job, steps: list[Step], handoff_seconds: float) -> Dispatch:
    """An ended job runs again (``merlin resume``): ``steps`` are Pending; some are queued.

    Each step starts afresh from the branch's head, escalated if it failed before; the
    attempts a lost worker or a cancel left open are cancelled.
    """
    _expect("reopen_job", job.status, RESUMABLE_JOB_STATUSES)
    now = utcnow()
    for step in steps:
        _expect("reopen_job", step.status, set(StepStatus) - {StepStatus.COMPLETED})
        close_open_attempts(step, AttemptStatus.CANCELLED, now)
        failed = (AttemptStatus.FAILED, AttemptStatus.ERROR)
        failed_before = any(a.status in failed for a in step.attempts)
        step.status = StepStatus.PENDING
        step.phase = Phase.ATTEMPT
        step.next_kind = AttemptKind.ESCALATE if failed_before else AttemptKind.EXECUTE
        step.error = step.result = None
        step.finished_at = None
        step.base_commit = None
        step.recoveries = 0
        step.lease_owner = step.lease_expires_at = None
    session.flush()
    dispatch = start_runnable(session, job, handoff_seconds)
    job.status = JobStatus.RUNNING if job.started_at else JobStatus.PENDING
    job.error = None
    job.finished_at = None
    job.patch_path = None
    job.updated_at = utcnow()
    return dispatch


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


def held_by_a_worker(step: Step) -> bool:
    """True while a worker (not a queued message) holds the step's unexpired lease."""
    owner, expires = step.lease_owner, step.lease_expires_at
    return owner not in (None, QUEUED) and expires is not None and expires > utcnow()


def _fail(step: Step, reason: str, now: datetime, status: str = StepStatus.FAILED) -> None:
    """Failed, or Parked: its open attempt cancelled, so a resume runs it on the same tier."""
    step.status = status
    step.error = reason
    step.finished_at = now
    step.phase = Phase.DONE
    ended = AttemptStatus.CANCELLED if status == StepStatus.PARKED else AttemptStatus.ERROR
    close_open_attempts(step, ended, now, reason)


def _skip(step: Step, result: str, now: datetime | None) -> None:
    step.status = StepStatus.SKIPPED
    step.result = result
    step.phase = Phase.DONE
    if now is not None:
        step.finished_at = now
    step.lease_owner = step.lease_expires_at = None


def _not_passed(job: Job) -> str:
    """Which steps of a finished job did not pass: ``failed: c; skipped: d``."""
    parts = []
    for status in (StepStatus.FAILED, StepStatus.SKIPPED):
        keys = [step.key for step in job.steps if step.status == status]
        if keys:
            parts.append(f"{status.value.lower()}: {', '.join(keys)}")
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
