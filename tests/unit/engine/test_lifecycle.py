"""Every status change: each named transition from each state, then failing a job for good.

The table holds every transition of ``merlin_flow.engine.lifecycle`` against every status of
the row it moves: where it leads, or that it is refused (nothing written) or a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.lifecycle import (
    approve_plan,
    await_approval,
    cancel_attempt,
    close_job,
    end_attempt,
    end_job,
    fail_attempt,
    fail_step,
    finish_job,
    pass_step,
    record_answer,
    reject_plan,
    reopen_job,
    start_job,
    start_step,
    stop_for_budget,
)
from merlin_flow.errors import TransitionRefused
from merlin_flow.failures import AttemptKind, FailureKind
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    RESUMABLE_JOB_STATUSES,
    Attempt,
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
from merlin_flow.store.events import JOB_ENDED, EventKind

# -- every named transition from every state ----------------------------------------------

REFUSED = "refused"
"""The transition does not apply: TransitionRefused, nothing written."""
UNCHANGED = "unchanged"
"""The transition is a no-op there: nothing written, no error."""


@dataclass(frozen=True)
class Transition:
    """A named transition, the row it moves, and where it leads from each state."""

    name: str
    row: str
    """"job", "step" or "attempt": whose status the table is about."""
    run: Callable[[Session, Job, Step, Attempt], object]
    moves: dict[str, str]
    """From-status -> to-status; a status not listed gives ``otherwise``."""
    otherwise: str = REFUSED
    events: tuple[EventKind, ...] = ()
    """What a move records."""


TRANSITIONS = [
    Transition(
        "record_answer",
        "job",
        lambda s, job, step, attempt: record_answer(s, job, "42", None),
        {JobStatus.PLANNING: JobStatus.COMPLETED},
        events=(EventKind.QUESTION_ANSWERED,),
    ),
    Transition(
        "record_answer (no answer)",
        "job",
        lambda s, job, step, attempt: record_answer(s, job, None, "the model gave no answer"),
        {JobStatus.PLANNING: JobStatus.FAILED},
        events=(EventKind.QUESTION_ANSWERED,),
    ),
    Transition(
        "await_approval",
        "job",
        lambda s, job, step, attempt: await_approval(s, job, "plan of 2 step(s)"),
        {JobStatus.PLANNING: JobStatus.AWAITING_APPROVAL},
        events=(EventKind.PLAN_READY,),
    ),
    Transition(
        "approve_plan",
        "job",
        lambda s, job, step, attempt: approve_plan(s, job, "ada", edited=False),
        {JobStatus.AWAITING_APPROVAL: JobStatus.PENDING},
        events=(EventKind.PLAN_APPROVED,),
    ),
    Transition(
        "reject_plan",
        "job",
        lambda s, job, step, attempt: reject_plan(s, job, "ada"),
        {JobStatus.AWAITING_APPROVAL: JobStatus.REJECTED},
        events=(EventKind.PLAN_REJECTED,),
    ),
    Transition(
        "start_job",
        "job",
        lambda s, job, step, attempt: start_job(s, job, sandboxed=True),
        {JobStatus.PENDING: JobStatus.RUNNING},
        otherwise=UNCHANGED,
        events=(EventKind.JOB_STARTED,),
    ),
    *(
        Transition(
            f"end_job ({status})",
            "job",
            lambda s, job, step, attempt, status=status: end_job(s, job.id, None, "why", status),
            {open_: status for open_ in set(JobStatus) - FINAL_JOB_STATUSES},
            otherwise=UNCHANGED,
            events=(JOB_ENDED[status],),
        )
        for status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.BUDGET_EXCEEDED)
    ),
    Transition(
        "finish_job",
        "job",
        lambda s, job, step, attempt: finish_job(s, job, "/tmp/job.patch"),
        {status: status for status in FINAL_JOB_STATUSES},
        events=(EventKind.JOB_FINISHED,),
    ),
    Transition(
        "reopen_job",
        "job",
        lambda s, job, step, attempt: reopen_job(s, job, [step], 1.0),
        {status: JobStatus.RUNNING for status in RESUMABLE_JOB_STATUSES},  # it had started
    ),
    Transition(
        "start_step",
        "step",
        lambda s, job, step, attempt: start_step(s, job, step),
        {StepStatus.PENDING: StepStatus.IN_PROGRESS},
        otherwise=UNCHANGED,
        events=(EventKind.STEP_STARTED,),
    ),
    Transition(
        "pass_step",
        "step",
        lambda s, job, step, attempt: pass_step(s, job, step, attempt, "b" * 40, 1.0),
        {StepStatus.IN_PROGRESS: StepStatus.COMPLETED},
        events=(EventKind.STEP_COMPLETED,),
    ),
    Transition(
        "fail_step",
        "step",
        lambda s, job, step, attempt: fail_step(s, job, step, "exit code 1"),
        {StepStatus.IN_PROGRESS: StepStatus.FAILED},
        events=(EventKind.STEP_FAILED, EventKind.STEP_SKIPPED),
    ),
    Transition(
        "end_attempt (committed)",
        "attempt",
        lambda s, job, step, attempt: end_attempt(
            s, job.id, "a", attempt, None, None, job_ended=False
        ),
        {AttemptStatus.RUNNING: AttemptStatus.COMMITTED},
        events=(EventKind.ATTEMPT_COMMITTED,),
    ),
    Transition(
        "end_attempt (error)",
        "attempt",
        lambda s, job, step, attempt: end_attempt(
            s, job.id, "a", attempt, "turn limit", FailureKind.CAPABILITY, job_ended=False
        ),
        {AttemptStatus.RUNNING: AttemptStatus.ERROR},
        events=(EventKind.ATTEMPT_ERROR,),
    ),
    Transition(
        "end_attempt (job ended)",
        "attempt",
        lambda s, job, step, attempt: end_attempt(
            s, job.id, "a", attempt, None, None, job_ended=True
        ),
        {AttemptStatus.RUNNING: AttemptStatus.CANCELLED},
        events=(EventKind.ATTEMPT_COMMITTED,),
    ),
    Transition(
        "stop_for_budget",
        "attempt",
        lambda s, job, step, attempt: stop_for_budget(s, job.id, step, attempt, "budget"),
        {AttemptStatus.RUNNING: AttemptStatus.ERROR},
        events=(EventKind.JOB_BUDGET_EXCEEDED,),
    ),
    Transition(
        "fail_attempt",
        "attempt",
        lambda s, job, step, attempt: fail_attempt(attempt),
        {
            AttemptStatus.COMMITTED: AttemptStatus.FAILED,
            AttemptStatus.PASSED: AttemptStatus.FAILED,
            AttemptStatus.FAILED: AttemptStatus.FAILED,
            AttemptStatus.ERROR: AttemptStatus.ERROR,
        },
    ),
    Transition(
        "cancel_attempt",
        "attempt",
        lambda s, job, step, attempt: cancel_attempt(attempt),
        {
            AttemptStatus.COMMITTED: AttemptStatus.CANCELLED,
            AttemptStatus.PASSED: AttemptStatus.CANCELLED,
            AttemptStatus.FAILED: AttemptStatus.CANCELLED,
        },
    ),
]
ENUMS = {"job": JobStatus, "step": StepStatus, "attempt": AttemptStatus}
CASES = [
    pytest.param(transition, status, id=f"{transition.name}: {status}")
    for transition in TRANSITIONS
    for status in ENUMS[transition.row]
]


def _rows(session: Session, job_id: str, row: str, status: str) -> tuple[Job, Step, Attempt]:
    """A job with two steps (the second needs the first) and an attempt; ``row`` at ``status``.

    The rest is where a job would be for the transitions on ``row`` to make sense: a
    running job, a step in progress, a committed attempt.
    """
    config = MerlinConfig(tiers=[Tier(name="local", model="scripted/none.yaml")])
    job = Job(
        id=job_id, title="t", repo="/r", branch=f"merlin/{job_id}", base_commit="a" * 40,
        head_commit="a" * 40, tasklist={}, config=config.model_dump(mode="json"),
        status=status if row == "job" else JobStatus.RUNNING, started_at=utcnow(),
        finished_at=utcnow() if row == "job" and status in FINAL_JOB_STATUSES else None,
    )  # fmt: skip
    first, second = (
        Step(position=n, key=key, step_type="Debug", description="d", exit_command="true",
             depends_on=needs, status=StepStatus.PENDING, phase=Phase.ATTEMPT)
        for n, key, needs in ((0, "a", []), (1, "b", ["a"]))
    )  # fmt: skip
    first.status = status if row == "step" else StepStatus.IN_PROGRESS
    attempt = Attempt(
        number=1, kind=AttemptKind.EXECUTE, tier="local", model="m", start_commit="a" * 40,
        commit="c" * 40, status=status if row == "attempt" else AttemptStatus.COMMITTED,
    )  # fmt: skip
    first.attempts.append(attempt)
    job.steps.extend([first, second])
    session.add(job)
    session.flush()
    return job, first, attempt


def _status(job: Job, step: Step, attempt: Attempt, row: str) -> str:
    return {"job": job.status, "step": step.status, "attempt": attempt.status}[row]


def _load(session: Session) -> tuple[Job, Step, Attempt]:
    job = session.get_one(Job, "j1")
    return job, job.steps[0], job.steps[0].attempts[0]


@pytest.mark.parametrize(("transition", "start"), CASES)
def test_every_transition_from_every_state(
    db: Database, transition: Transition, start: str
) -> None:
    expected = transition.moves.get(start, transition.otherwise)
    with db.session() as session:
        _rows(session, "j1", transition.row, start)
    with db.session() as session:
        rows = _load(session)
        if expected == REFUSED:
            with pytest.raises(TransitionRefused, match=transition.name.split(" ")[0]):
                transition.run(session, *rows)
        else:
            transition.run(session, *rows)
    with db.reader() as session:
        found = _status(*_load(session), transition.row)
        kinds = session.scalars(select(Event.kind).where(Event.job_id == "j1")).all()
    assert found == (start if expected in (REFUSED, UNCHANGED) else expected)
    if expected in (REFUSED, UNCHANGED):
        assert kinds == []  # nothing written
    else:
        assert set(transition.events) <= set(kinds)


def test_a_refused_transition_names_the_state_it_found(db: Database) -> None:
    with db.session() as session:
        _rows(session, "j1", "job", JobStatus.RUNNING)
    with db.session() as session, pytest.raises(TransitionRefused) as refused:
        approve_plan(session, _load(session)[0], "ada", edited=False)
    assert str(refused.value) == "approve_plan applies to awaiting_approval, not to running"


def test_end_job_fails_its_step_and_skips_the_pending_ones_but_a_claimed_one(
    db: Database,
) -> None:
    with db.session() as session:
        job, step, attempt = _rows(session, "j1", "job", JobStatus.RUNNING)
        claimed = Step(
            position=2, key="c", step_type="Debug", description="d", exit_command="true",
            status=StepStatus.PENDING, phase=Phase.ATTEMPT, lease_owner="host/x:1:tag:w",
            lease_expires_at=utcnow() + timedelta(seconds=60),
        )  # fmt: skip
        job.steps.append(claimed)
        session.flush()
        end_job(session, job.id, step, "boom", JobStatus.FAILED)
        assert (job.status, job.error) == (JobStatus.FAILED, "boom")
        assert (step.status, step.error, step.phase) == (StepStatus.FAILED, "boom", Phase.DONE)
        assert attempt.status == AttemptStatus.ERROR  # it had no verdict: closed with the step
        assert job.steps[1].status == StepStatus.SKIPPED
        assert job.steps[1].result == "skipped: the job ended (failed) before this step"
        assert claimed.status == StepStatus.PENDING  # its worker stops at its first call
    with db.session() as session, pytest.raises(TransitionRefused):
        end_job(session, "j1", None, "x", JobStatus.COMPLETED)  # not an early end


@pytest.mark.parametrize(
    ("second", "closes", "status", "error"),
    [
        (StepStatus.COMPLETED, True, JobStatus.COMPLETED, None),
        (StepStatus.SKIPPED, True, JobStatus.PARTIALLY_COMPLETED, "skipped: b"),
        (StepStatus.FAILED, True, JobStatus.PARTIALLY_COMPLETED, "failed: b"),
        (StepStatus.PENDING, False, JobStatus.RUNNING, None),
        (StepStatus.IN_PROGRESS, False, JobStatus.RUNNING, None),
    ],
)
def test_close_job_decides_the_final_status_from_the_steps(
    db: Database, second: StepStatus, closes: bool, status: JobStatus, error: str | None
) -> None:
    with db.session() as session:
        job, step, _ = _rows(session, "j1", "job", JobStatus.RUNNING)
        step.status = StepStatus.COMPLETED
        job.steps[1].status = second
        assert close_job(session, job) is closes
        assert (job.status, job.error) == (status, error)


def test_close_job_after_a_cancel_waits_for_a_worker_then_skips_what_is_left(
    db: Database,
) -> None:
    with db.session() as session:
        _, step, _ = _rows(session, "j1", "job", JobStatus.CANCELLED)
        step.lease_owner = "host/x:1:tag:w"
        step.lease_expires_at = utcnow() + timedelta(seconds=60)
    with db.session() as session:
        job = session.get_one(Job, "j1")
        assert close_job(session, job) is False  # a worker still runs step a
        job.steps[0].lease_expires_at = utcnow() - timedelta(seconds=1)  # it died
    with db.session() as session:
        job = session.get_one(Job, "j1")
        assert close_job(session, job) is True
        assert [s.status for s in job.steps] == [StepStatus.SKIPPED, StepStatus.SKIPPED]
        assert job.steps[0].attempts[0].status == AttemptStatus.CANCELLED
        assert job.status == JobStatus.CANCELLED


def test_reopen_job_queues_what_may_run_and_escalates_what_failed(db: Database) -> None:
    with db.session() as session:
        job, step, attempt = _rows(session, "j1", "job", JobStatus.FAILED)
        step.status, attempt.status = StepStatus.FAILED, AttemptStatus.FAILED
        job.steps[1].status = StepStatus.SKIPPED
        dispatch = reopen_job(session, job, list(job.steps), 1.0)
        assert dispatch.start == ("a",)  # b needs a
        assert job.status == JobStatus.RUNNING  # it had started before
        assert (job.error, job.finished_at, job.patch_path) == (None, None, None)
        assert [s.status for s in job.steps] == [StepStatus.PENDING, StepStatus.PENDING]
        assert step.next_kind == AttemptKind.ESCALATE  # it failed: afresh, with feedback
        assert job.steps[1].next_kind == AttemptKind.EXECUTE
