"""The verify task's work: run the step's exit command on the last attempt, and decide.

A pass moves the job branch to the attempt's commit and hands the next step to the
queue; a failure plans a fix or an escalation (``escalation.decide``), or ends the job
when no tier is left or the budget cannot pay for the next one. Every write is made
under the job's lock and while holding the step's lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from merlin_flow.agent import first_messages
from merlin_flow.attempt import step_brief, step_environment
from merlin_flow.budget import BudgetGuard
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.environment import prepare_worktree, step_confinement
from merlin_flow.errors import BudgetExceeded, LeaseLost, SetupFailed
from merlin_flow.escalation import (
    Action,
    AttemptKind,
    Decision,
    decide,
    failure_of,
    failure_reason,
    feedback_for,
)
from merlin_flow.exit_commands import run_exit_command
from merlin_flow.git import add_worktree, diff, remove_worktree
from merlin_flow.journal import CallContext, record_call
from merlin_flow.leases import Heartbeat, queued_values
from merlin_flow.lifecycle import (
    HeldStep,
    Outcome,
    add_event,
    end_job_in_session,
    fail_job_in_session,
    finalize_job,
    hand_off,
    load_step,
    lock_job,
    release_step,
)
from merlin_flow.llm import Completion, complete
from merlin_flow.process import CommandResult
from merlin_flow.repository import JobRepository, repository_of
from merlin_flow.settings import Settings
from merlin_flow.spec_check import (
    CHECK_CHARS,
    CheckResult,
    Policy,
    SpecOutcome,
    parse_answer,
    policy,
    run_check,
    spec_constraints,
)
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    Attempt,
    AttemptStatus,
    Database,
    Job,
    JobStatus,
    LlmCall,
    Phase,
    Step,
    StepStatus,
    utcnow,
)
from merlin_flow.tasklist import StepType
from merlin_flow.tools import TOOL_SCHEMAS

log = logging.getLogger(__name__)

SPEC_CHECK_TURN = -1
"""The journal's turn for the spec check's call: after the attempt, never replayed."""


@dataclass(frozen=True)
class _Verdict:
    """The outcome of one verification, for the step ``held``."""

    held: HeldStep
    attempt_id: int
    passed: bool
    exit_code: int | None  # None: the exit command did not run (agent error, or re-recording)
    output: str
    spec: SpecOutcome | None = None  # the spec check, when one ran after a passed command

    def record_on(self, attempt: Attempt) -> None:
        if self.exit_code is not None:
            attempt.exit_code, attempt.output_tail = self.exit_code, self.output
        if self.spec is not None and self.spec.fails:
            attempt.error = self.spec.error()
        attempt.finished_at = attempt.finished_at or utcnow()

    def record_spec_check(self, session: Session, attempt: Attempt) -> None:
        """The spec check's event in the job's history (warnings reach the summary)."""
        if self.spec is not None:
            kind, message = self.spec.event()
            violations = [str(v) for v in self.spec.result.violations]
            add_event(
                session,
                self.held.job_id,
                kind,
                message,
                self.held.step_key,
                attempt=attempt.number,
                policy=self.spec.policy.value,
                specs=list(self.spec.specs),
                violations=violations,
            )


def verify_step(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str
) -> Outcome:
    """Run the exit command on the last attempt's commit and decide what follows."""
    with db.reader() as session:
        job, step = load_step(session, job_id, step_key)
        if job is None or step is None or job.status in FINAL_JOB_STATUSES:
            return Outcome.STOP
        if step.phase != Phase.VERIFY:
            return Outcome.STOP
        held = HeldStep(
            db, settings, job_id, step_key, step.id, token, MerlinConfig.model_validate(job.config)
        )
        location, branch = job.repo, job.branch
    repository = repository_of(location, settings)

    def judge_and_decide(heartbeat: Heartbeat) -> Outcome:
        verdict = _judge(held, repository)
        if verdict.passed and verdict.exit_code is not None:
            verdict = _spec_check(verdict, repository)
        if heartbeat.lost:
            raise LeaseLost(f"step {step_key}: lease lost during verification")
        # A job cancelled meanwhile is checked by _pass and _fail, under the job's lock.
        return _pass(verdict, repository, branch) if verdict.passed else _fail(verdict)

    return held.work(Phase.VERIFY, judge_and_decide)


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
    worktree = held.worktree(f"{held.step_key}-{number}-verify")
    try:
        result = _run_in_worktree(held, repository, commit, worktree, command)
    except SetupFailed as exc:
        # The attempt's commit changed the files setup depends on, and setup no longer
        # succeeds: the attempt failed, not the job (setup passed at the step's start
        # commit before the attempt ran).
        result = CommandResult(1, str(exc), timed_out=False, duration=0.0)
    return _Verdict(held, attempt_id, result.ok, result.exit_code, result.output_tail)


def _run_in_worktree(
    held: HeldStep, repository: JobRepository, commit: str, worktree: Path, command: str
) -> CommandResult:
    """Run the exit command on ``commit``, in its environment, in a worktree of its own."""
    environment = step_environment(held, repository, commit)
    try:
        add_worktree(repository.path, worktree, commit)
        prepare_worktree(environment, worktree)
        confinement = step_confinement(worktree, environment, held.config)
        return run_exit_command(command, confinement, held.config)
    finally:
        remove_worktree(repository.path, worktree)


def _spec_check(verdict: _Verdict, repository: JobRepository) -> _Verdict:
    """Check the passed attempt's diff against the relevant specs (``spec_check``).

    The diff is the step's whole change (its base commit to the attempt's commit): a fix
    attempt is checked with the changes of the attempts it builds on.
    """
    held = verdict.held
    with held.db.reader() as session:
        job = session.get_one(Job, held.job_id)
        step = session.get_one(Step, held.step_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        steps = job.tasklist.get("steps", [])
        flagged = any(s.get("id") == step.key and s.get("spec_check") for s in steps)
        base, commit = step.base_commit or attempt.start_commit, attempt.commit
        description, budget, run = step.description, job.budget_usd, attempt.runs
        original = _original_check(session, job, step, attempt) if job.replay_of else None
        replaying = job.replay_of is not None
    mode = policy(held.config, flagged)
    if mode is Policy.OFF or not commit:
        return verdict
    constraints, paths = spec_constraints(
        repository.path, base, held.config, description, CHECK_CHARS
    )
    patch = diff(repository.path, base, commit)
    if not constraints or not patch.strip():
        return verdict
    tier = held.config.spec_check_tier()
    guard = BudgetGuard(held.db, held.job_id, budget, held.config.limits.expected_completion_tokens)
    context = CallContext(held.job_id, held.step_id, verdict.attempt_id, run, tier)

    def journaled(tier: Tier, messages: list[dict[str, Any]], tools: list[Any]) -> Completion:
        guard.before_call(tier, messages, tools)  # refused: the check could not run
        with held.db.reader() as session:
            last = session.scalar(
                select(func.max(LlmCall.seq)).where(LlmCall.attempt_id == verdict.attempt_id)
            )
        seq = 0 if last is None else last + 1
        try:
            reply = complete(tier, messages, tools)
        except Exception as exc:
            record_call(held.db, context, seq, SPEC_CHECK_TURN, None, exc)
            raise
        record_call(held.db, context, seq, SPEC_CHECK_TURN, reply, None)
        return reply

    if replaying:  # a replay answers from its original's journal only: no live call
        missing = "spec check could not run: the original job made no such check"
        result = parse_answer(original) if original is not None else CheckResult(note=missing)
    else:
        result = run_check(tier, constraints, patch, journaled)
    outcome = SpecOutcome(mode, tuple(paths), result)
    return replace(verdict, passed=not outcome.fails, spec=outcome)


def _original_check(session: Session, job: Job, step: Step, attempt: Attempt) -> str | None:
    """For a replay job: the answer the original job's spec check got, for this attempt."""
    response = session.scalars(
        select(LlmCall.response)
        .join(Attempt, LlmCall.attempt_id == Attempt.id)
        .join(Step, Attempt.step_id == Step.id)
        .where(
            Step.job_id == job.replay_of,
            Step.key == step.key,
            Attempt.number == attempt.number,
            LlmCall.turn == SPEC_CHECK_TURN,
            LlmCall.error.is_(None),
        )
        .order_by(LlmCall.seq.desc())
    ).first()
    return None if response is None else str(response.get("content") or "")


def _pass(verdict: _Verdict, repository: JobRepository, branch: str) -> Outcome:
    held = verdict.held
    with held.db.session() as session:
        job = lock_job(session, held.job_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        commit = attempt.commit or attempt.start_commit
        release_step(session, held.step_id, held.token)
        step = session.get_one(Step, held.step_id)
        if job.status in FINAL_JOB_STATUSES:  # cancelled meanwhile: the branch stays
            verdict.record_on(attempt)
            attempt.status = AttemptStatus.CANCELLED
        # The branch moves inside the transaction: if the database write then fails, the
        # lease expires, verify runs again and finds the branch already at `commit`.
        elif not repository.advance(branch, commit, job.head_commit) and (
            repository.branch_head(branch) != commit
        ):
            reason = (
                f"step {step.key} passed, but the job branch {branch} was moved by someone "
                f"else (expected it at {job.head_commit[:10]}); not overwriting it"
            )
            fail_job_in_session(session, held.job_id, step, reason)
        else:
            _complete(session, held.settings, job, step, attempt, verdict, commit)
            return Outcome.CONTINUE
    finalize_job(held.db, held.settings, held.job_id)
    return Outcome.STOP


def _complete(
    session: Session,
    settings: Settings,
    job: Job,
    step: Step,
    attempt: Attempt,
    verdict: _Verdict,
    commit: str,
) -> None:
    """Record a passed step, in the transaction that moved the job branch."""
    now = utcnow()
    verdict.record_on(attempt)
    attempt.status = AttemptStatus.PASSED
    step.status = StepStatus.COMPLETED
    step.result = attempt.summary or f"verified by `{step.exit_command}`"
    step.error = None
    step.finished_at = now
    job.head_commit = commit
    job.updated_at = now
    verdict.record_spec_check(session, attempt)
    add_event(
        session,
        job.id,
        "step_completed",
        f"step {step.key} passed on tier {attempt.tier}",
        step.key,
    )
    following = session.scalars(
        select(Step)
        .where(Step.job_id == job.id, Step.position > step.position)
        .order_by(Step.position)
    ).first()
    if following is not None:
        for key, value in queued_values(settings.handoff_seconds).items():
            setattr(following, key, value)


def _fail(verdict: _Verdict) -> Outcome:
    held = verdict.held
    with held.db.session() as session:
        ended = lock_job(session, held.job_id).status in FINAL_JOB_STATUSES
        step = session.get_one(Step, held.step_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        verdict.record_on(attempt)
        if attempt.status != AttemptStatus.ERROR:
            attempt.status = AttemptStatus.FAILED
        if verdict.exit_code:
            add_event(
                session,
                held.job_id,
                "verify_failed",
                _verify_failure(held.job_id, step, verdict),
                step.key,
                attempt=attempt.number,
                exit_code=verdict.exit_code,
            )
        session.flush()
        verdict.record_spec_check(session, attempt)
        if ended:  # cancelled meanwhile: no fix, no escalation
            release_step(session, held.step_id, held.token)
        elif _plan_next(session, verdict, step, attempt):
            return Outcome.RETRY
    finalize_job(held.db, held.settings, held.job_id)
    return Outcome.STOP


def _verify_failure(job_id: str, step: Step, verdict: _Verdict) -> str:
    """A failed exit command in a few lines: the command, its exit code, its last lines."""
    lines = [line for line in verdict.output.rstrip().splitlines() if line.strip()][-5:]
    tail = "".join(f"\n    {line}" for line in lines)
    return (
        f"`{step.exit_command}` exited with code {verdict.exit_code}:{tail}"
        f"\n    (all output: merlin logs {job_id} --step {step.key})"
    )


def _plan_next(session: Session, verdict: _Verdict, step: Step, attempt: Attempt) -> bool:
    """Plan a fix or an escalation (True), or end the job (False).

    The job ends when the escalation cannot be paid for, or when every tier failed.
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
    over_budget = _escalation_over_budget(held, session, step, nxt)
    if over_budget is not None:
        release_step(session, held.step_id, held.token)
        end_job_in_session(session, held.job_id, step, over_budget, JobStatus.BUDGET_EXCEEDED)
        return False
    if nxt.action not in (Action.FIX, Action.ESCALATE):
        release_step(session, held.step_id, held.token)
        reason = f"step {step.key} failed on every tier: {failure_reason(attempt)}"
        fail_job_in_session(session, held.job_id, step, reason)
        return False
    to_tier = config.tiers[nxt.tier_index].name
    add_event(
        session,
        held.job_id,
        "escalated" if nxt.action is Action.ESCALATE else "fix_planned",
        f"attempt {attempt.number} failed ({nxt.reason}); "
        f"next: {nxt.attempt_kind} on tier {to_tier}",
        step.key,
        from_tier=config.tiers[step.tier_index].name,
        to_tier=to_tier,
        reason=nxt.reason[:2000],
    )
    hand_off(
        session,
        held.step_id,
        held.token,
        Phase.ATTEMPT,
        held.settings.handoff_seconds,
        next_kind=nxt.attempt_kind.value,
        tier_index=nxt.tier_index,
    )
    return True


def _escalation_over_budget(
    held: HeldStep, session: Session, step: Step, nxt: Decision
) -> str | None:
    """Why the planned escalation cannot be paid for, or None when it can."""
    budget = session.get_one(Job, held.job_id).budget_usd
    if nxt.action is not Action.ESCALATE or budget is None:
        return None
    feedback = feedback_for(AttemptKind.ESCALATE, list(step.attempts))
    messages = first_messages(step_brief(step), feedback)
    guard = BudgetGuard(held.db, held.job_id, budget, held.config.limits.expected_completion_tokens)
    try:
        guard.check(held.config.tiers[nxt.tier_index], messages, TOOL_SCHEMAS, "escalating")
    except BudgetExceeded as exc:
        return f"step {step.key} stopped before escalating: {exc}"
    return None
