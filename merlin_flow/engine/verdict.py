"""The verify task's work: run the step's exit command on the last attempt, and decide.

A pass moves the job branch to the attempt's commit (merged and verified again when
steps beside it moved the branch: ``merlin_flow.engine.integration``) and queues the steps it
lets start; a failure plans a fix or an escalation (``failures.decide``), or ends the job
when no tier is left or the budget cannot pay for the next one. Every write is made
under the job's lock and while holding the step's lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from merlin_flow.engine.budget import escalation_over_budget
from merlin_flow.engine.dispatch import Dispatch, Outcome, start_runnable
from merlin_flow.engine.feedback import failure_of, step_failure, verify_failure
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.held_step import HeldStep, load_step, lock_job
from merlin_flow.engine.integration import (
    INTEGRATION_FAILED,
    Integration,
    commands_to_reverify,
    failure_details,
    integrate,
)
from merlin_flow.engine.leases import Heartbeat, hand_off, release_step
from merlin_flow.engine.lifecycle import cancel_attempt, end_job, fail_attempt, fail_step, pass_step
from merlin_flow.engine.spec_review import review_attempt
from merlin_flow.errors import LeaseLost, SetupFailed
from merlin_flow.failures import Action, AttemptKind, decide
from merlin_flow.planning.spec_check import SpecOutcome
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    Attempt,
    AttemptStatus,
    Database,
    Job,
    JobStatus,
    Phase,
    Step,
    utcnow,
)
from merlin_flow.store.events import (
    EventKind,
    ExitCodeData,
    IntegratedData,
    SpecCheckData,
    add_event,
)
from merlin_flow.tasklist import OnFailure, StepType
from merlin_flow.workspace.git import diff
from merlin_flow.workspace.process import CommandResult
from merlin_flow.workspace.repository import JobRepository, repository_of

log = logging.getLogger(__name__)

MAX_INTEGRATIONS = 5
"""Merges of one passed step onto a branch that kept moving, before the attempt fails."""


@dataclass(frozen=True)
class _Verdict:
    """The outcome of one verification, for the step ``held``."""

    held: HeldStep
    attempt_id: int
    passed: bool
    exit_code: int | None  # None: the exit command did not run (agent error, or re-recording)
    output: str
    spec: SpecOutcome | None = None  # the spec check, when one ran after a passed command
    integration: Integration | None = None  # one that failed: a conflict, a failed re-run
    stopped: bool = False  # a command was killed because the job ended (cancelled)

    def record_on(self, attempt: Attempt) -> None:
        if self.exit_code is not None:
            attempt.exit_code, attempt.output_tail = self.exit_code, self.output
        if self.spec is not None and self.spec.fails:
            attempt.error = self.spec.error()
        if self.integration is not None:
            attempt.error = self.integration.error
            attempt.exit_code = self.integration.exit_code
            attempt.output_tail = self.integration.details
        attempt.finished_at = attempt.finished_at or utcnow()

    def record_spec_check(self, session: Session, attempt: Attempt) -> None:
        """The spec check's event in the job's history (warnings reach the summary)."""
        if self.spec is not None:
            kind, message = self.spec.event()
            data: SpecCheckData = {
                "attempt": attempt.number,
                "policy": self.spec.policy.value,
                "specs": list(self.spec.specs),
                "violations": [str(v) for v in self.spec.result.violations],
            }
            add_event(session, self.held.job_id, kind, message, self.held.step_key, data)


def verify_step(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str
) -> tuple[Outcome, Dispatch]:
    """Run the exit command on the last attempt's commit and decide what follows.

    The ``Dispatch`` names the steps the verdict let start and whether the job finished.
    """
    with db.reader() as session:
        job, step = load_step(session, job_id, step_key)
        if job is None or step is None or job.status in FINAL_JOB_STATUSES:
            return Outcome.STOP, Dispatch()
        if step.phase != Phase.VERIFY:
            return Outcome.STOP, Dispatch()
        held = HeldStep.of(db, settings, job, step, token)
        location, branch = job.repo, job.branch
    repository = repository_of(location, settings)
    decided: list[Dispatch] = []

    def judge_and_decide(heartbeat: Heartbeat) -> Outcome:
        verdict = _judge(held, repository)
        if verdict.passed and verdict.exit_code is not None:
            verdict = _spec_check(verdict, repository)
        if heartbeat.lost:
            raise LeaseLost(f"step {step_key}: lease lost during verification")
        # A job cancelled meanwhile is checked by _pass and _fail, under the job's lock.
        if verdict.passed:
            outcome, dispatch = _integrate_and_pass(verdict, repository, branch, heartbeat)
        else:
            outcome, dispatch = _fail(verdict)
        decided.append(dispatch)
        return outcome

    outcome = held.work(Phase.VERIFY, judge_and_decide)
    return outcome, decided[-1] if decided else Dispatch()


def _judge(held: HeldStep, repository: JobRepository) -> _Verdict:
    """Run the exit command on the last attempt's commit, if it has one to verify."""
    with held.db.reader() as session:
        attempt = session.get_one(Step, held.step_id).attempts[-1]
        attempt_id, number, status = attempt.id, attempt.number, attempt.status
        commit, command = attempt.commit, attempt.step.exit_command
    if status != AttemptStatus.COMMITTED or not commit:
        # An agent error; or a verify delivered again, after its verdict was recorded.
        return _Verdict(held, attempt_id, status == AttemptStatus.PASSED, None, "")
    repository.have(held.job_id, commit)
    try:
        name = f"{held.step_key}-{number}-verify"
        _, result = _run_in_checkout(held, repository, commit, name, command)
    except SetupFailed as exc:
        # The attempt's commit changed the files setup depends on, and setup no longer
        # succeeds: the attempt failed, not the job (setup passed at the step's start
        # commit before the attempt ran).
        result = CommandResult(1, str(exc), timed_out=False, duration=0.0)
    return _Verdict(
        held, attempt_id, result.ok, result.exit_code, result.output_tail, stopped=result.stopped
    )


def _run_in_checkout(
    held: HeldStep, repository: JobRepository, commit: str, name: str, *commands: str
) -> tuple[str, CommandResult]:
    """Run exit commands on ``commit``, in its environment, in one checkout of its own.

    They run in order until one fails; returns the last one run and its result.
    """
    with held.checkout(repository, commit, name) as checkout:
        for command in commands:
            result = checkout.run_exit_command(command, held.config)
            if not result.ok:
                break
        return command, result


def _spec_check(verdict: _Verdict, repository: JobRepository) -> _Verdict:
    """The passed attempt, checked against the relevant specs (``spec_review``)."""
    outcome = review_attempt(verdict.held, verdict.attempt_id, repository)
    if outcome is None:
        return verdict
    return replace(verdict, passed=not outcome.fails, spec=outcome)


def _integrate_and_pass(
    verdict: _Verdict, repository: JobRepository, branch: str, heartbeat: Heartbeat
) -> tuple[Outcome, Dispatch]:
    """Move the branch to the passed commit, merged and verified again if the branch moved.

    The branch may move again while the merged tree is verified (another sibling
    passed): then the step's change is merged onto the new head, up to
    ``MAX_INTEGRATIONS`` times.
    """
    held = verdict.held
    for _ in range(MAX_INTEGRATIONS):
        with held.db.reader() as session:
            job = session.get_one(Job, held.job_id)
            step = session.get_one(Step, held.step_id)
            attempt = session.get_one(Attempt, verdict.attempt_id)
            onto, commit = job.head_commit, attempt.commit or attempt.start_commit
            start = attempt.start_commit
            base = step.base_commit or attempt.start_commit
            commands = commands_to_reverify(job.steps, step)
            message = (
                f"{held.commit_subject(step.description)}\n\n"
                f"Job {held.job_id}, attempt {attempt.number}, merged onto {onto[:10]}."
            )
            name = f"{held.step_key}-{attempt.number}-merged"

        def run(merged: str, commands: list[str], name: str = name) -> tuple[str, CommandResult]:
            try:
                return _run_in_checkout(held, repository, merged, name, *commands)
            except SetupFailed as exc:
                return commands[0], CommandResult(1, str(exc), timed_out=False, duration=0.0)

        repository.have(held.job_id, onto, commit)
        integration = integrate(repository.path, onto, commit, commands, message, run, start)
        if heartbeat.lost:
            raise LeaseLost(f"step {held.step_key}: lease lost during integration")
        if integration.commit is None:
            change = diff(repository.path, base, commit)
            details = failure_details(integration.details, change)
            failed = replace(integration, details=details)
            return _fail(replace(verdict, passed=False, integration=failed))
        decided = _pass(verdict, repository, branch, integration)
        if decided is not None:
            return decided
    error = f"{INTEGRATION_FAILED}the job branch kept moving while the step was merged onto it"
    failed = Integration(onto, None, error=error)
    return _fail(replace(verdict, passed=False, integration=failed))


def _pass(
    verdict: _Verdict, repository: JobRepository, branch: str, integration: Integration
) -> tuple[Outcome, Dispatch] | None:
    """Move the branch and record the pass; None if the branch moved since ``integration``."""
    held = verdict.held
    commit = integration.commit or integration.onto
    with held.db.session() as session:
        job = lock_job(session, held.job_id)
        if job.status not in FINAL_JOB_STATUSES and job.head_commit != integration.onto:
            return None  # a sibling passed meanwhile: merge onto the new head
        attempt = session.get_one(Attempt, verdict.attempt_id)
        release_step(session, held.step_id, held.token)
        step = session.get_one(Step, held.step_id)
        if job.status in FINAL_JOB_STATUSES:  # cancelled meanwhile: the branch stays
            verdict.record_on(attempt)
            cancel_attempt(attempt)
        # The branch moves inside the transaction: if the database write then fails, the
        # lease expires, verify runs again and finds the branch already at `commit`.
        elif not repository.advance(branch, commit, job.head_commit) and (
            repository.branch_head(branch) != commit
        ):
            reason = (
                f"step {step.key} passed, but the job branch {branch} was moved by someone "
                f"else (expected it at {job.head_commit[:10]}); not overwriting it"
            )
            end_job(session, held.job_id, step, reason, JobStatus.FAILED)
        else:
            dispatch = _complete(session, held.settings, job, step, attempt, verdict, integration)
            return Outcome.CONTINUE, dispatch
    finalize_job(held.db, held.settings, held.job_id)
    return Outcome.STOP, Dispatch()


def _complete(
    session: Session,
    settings: Settings,
    job: Job,
    step: Step,
    attempt: Attempt,
    verdict: _Verdict,
    integration: Integration,
) -> Dispatch:
    """Record a passed step where the branch moved; queue the steps its pass lets start."""
    verdict.record_on(attempt)
    verdict.record_spec_check(session, attempt)
    head = integration.commit or integration.onto
    merged: IntegratedData | None = None
    if integration.merged:
        merged = {"onto": integration.onto, "commit": head, "commands": list(integration.commands)}
    return pass_step(session, job, step, attempt, head, settings.handoff_seconds, merged)


def _fail(verdict: _Verdict) -> tuple[Outcome, Dispatch]:
    held = verdict.held
    if verdict.stopped or (verdict.integration is not None and verdict.integration.stopped):
        return _stopped(verdict)
    dispatch = Dispatch()
    with held.db.session() as session:
        ended = lock_job(session, held.job_id).status in FINAL_JOB_STATUSES
        step = session.get_one(Step, held.step_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        verdict.record_on(attempt)
        fail_attempt(attempt)
        if verdict.exit_code and verdict.integration is None:
            message = verify_failure(held.job_id, step, verdict.exit_code, verdict.output)
            data: ExitCodeData = {"attempt": attempt.number, "exit_code": verdict.exit_code}
            add_event(session, held.job_id, EventKind.VERIFY_FAILED, message, step.key, data)
        if verdict.integration is not None:
            add_event(
                session,
                held.job_id,
                EventKind.INTEGRATION_FAILED,
                attempt.error or INTEGRATION_FAILED,
                step.key,
                {"attempt": attempt.number, "onto": verdict.integration.onto},
            )
        session.flush()
        verdict.record_spec_check(session, attempt)
        if ended:  # cancelled meanwhile: no fix, no escalation
            release_step(session, held.step_id, held.token)
        else:
            retrying, dispatch = _plan_next(session, verdict, step, attempt)
            if retrying:
                return Outcome.RETRY, dispatch
    finalize_job(held.db, held.settings, held.job_id)  # waits while other steps run
    return Outcome.STOP, dispatch


def _stopped(verdict: _Verdict) -> tuple[Outcome, Dispatch]:
    """The job ended while the attempt's command ran: the attempt is cancelled, not failed."""
    held = verdict.held
    with held.db.session() as session:
        lock_job(session, held.job_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        if attempt.status == AttemptStatus.COMMITTED:  # not closed since (by a resume)
            verdict.record_on(attempt)
            attempt.error = "stopped: the job ended while its exit command ran"
            cancel_attempt(attempt)
        release_step(session, held.step_id, held.token)
    finalize_job(held.db, held.settings, held.job_id)
    return Outcome.STOP, Dispatch()


def _plan_next(
    session: Session, verdict: _Verdict, step: Step, attempt: Attempt
) -> tuple[bool, Dispatch]:
    """Plan a fix or an escalation (True), or end the step (False, and what that starts).

    The job ends when the escalation cannot be paid for, or when every tier failed a
    step whose ``on_failure`` is ``stop``; with ``continue``, the step fails alone.
    """
    held = verdict.held
    config = held.config
    nxt = decide(
        failure_of(attempt),
        attempts=list(step.attempts),
        tier_index=step.tier_index,
        next_tier=config.next_tier(step.tier_index, StepType(step.step_type)),
        limits=config.limits,
    )
    over_budget = escalation_over_budget(held.db, session, step, nxt, held.config)
    if over_budget is not None:
        release_step(session, held.step_id, held.token)
        end_job(session, held.job_id, step, over_budget, JobStatus.BUDGET_EXCEEDED)
        return False, Dispatch()
    if nxt.action not in (Action.FIX, Action.ESCALATE):
        release_step(session, held.step_id, held.token)
        reason = f"step {step.key} failed on every tier: {step_failure(step)}"
        if step.on_failure == OnFailure.CONTINUE:
            job = session.get_one(Job, held.job_id)
            fail_step(session, job, step, reason)
            return False, start_runnable(session, job, held.settings.handoff_seconds)
        end_job(session, held.job_id, step, reason, JobStatus.FAILED)
        return False, Dispatch()
    kind = nxt.attempt_kind
    if kind is AttemptKind.FIX and verdict.integration is not None:
        kind = AttemptKind.INTEGRATE  # from the branch's new head, not the attempt's commit
    to_tier = config.tiers[nxt.tier_index].name
    add_event(
        session,
        held.job_id,
        EventKind.ESCALATED if nxt.action is Action.ESCALATE else EventKind.FIX_PLANNED,
        f"attempt {attempt.number} failed ({nxt.reason}); next: {kind} on tier {to_tier}",
        step.key,
        {
            "from_tier": config.tiers[step.tier_index].name,
            "to_tier": to_tier,
            "reason": nxt.reason[:2000],
        },
    )
    hand_off(
        session,
        held.step_id,
        held.token,
        Phase.ATTEMPT,
        held.settings.handoff_seconds,
        next_kind=kind.value,
        tier_index=nxt.tier_index,
    )
    return True, Dispatch()
