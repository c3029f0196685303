"""The step task's work: an attempt, where the agent edits a worktree, and its commit.

It starts from the database: a task delivered twice, or again after a crash, finds out
there what already happened and does only what is left (an attempt a lost worker left
running resumes, replaying the calls it had paid for). Every write that ends the phase is
conditional on still holding the step's lease (``merlin_flow.engine.leases``).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from merlin_flow.agents.choice import stored_agent
from merlin_flow.agents.condense import Condensation
from merlin_flow.agents.definitions import AgentDefinition
from merlin_flow.agents.loop import MODEL_UNREACHABLE, StepBrief, for_the_record, run_agent
from merlin_flow.agents.step_tools import (
    can_write,
    open_step_tools,
    step_brief,
    with_instructions,
    with_map,
)
from merlin_flow.config import MerlinConfig
from merlin_flow.engine.attempt_commit import commit_attempt
from merlin_flow.engine.budget import job_guard
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.feedback import feedback_for
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.held_step import HeldStep, job_has_ended, load_step, lock_job
from merlin_flow.engine.leases import Heartbeat, hand_off, release_step, settle
from merlin_flow.engine.lifecycle import end_attempt, start_job, start_step, stop_for_budget
from merlin_flow.errors import (
    AgentError,
    BudgetExceeded,
    JobCancelled,
    LeaseLost,
    ModelUnreachable,
    ToolSourceError,
)
from merlin_flow.failures import AttemptKind, FailureKind
from merlin_flow.models.credentials import tier_access
from merlin_flow.models.journal import (
    CallContext,
    JournalEntry,
    OriginalJournal,
    Replayer,
    ResponseCache,
    record_call,
    replayable_calls,
)
from merlin_flow.models.llm import Completion, complete
from merlin_flow.planning.spec_check import with_spec_constraints
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Attempt,
    AttemptStatus,
    Database,
    Job,
    LlmCall,
    Phase,
    Step,
)
from merlin_flow.store.events import AttemptData, CondensedData, EventKind, add_event
from merlin_flow.tasklist import StepType
from merlin_flow.tool_config import SandboxMode
from merlin_flow.workspace.citations import marked_at
from merlin_flow.workspace.git import attempt_ref, same_tree, write_excludes_file
from merlin_flow.workspace.repository import JobRepository, repository_of

log = logging.getLogger(__name__)

NO_CHANGES = (
    "the attempt changed no file: the model finished after {turns} turn(s) without "
    "editing anything, so there was nothing to verify"
)
"""The error of an attempt that committed nothing (except on a Verify step)."""


@dataclass(frozen=True)
class _AttemptPlan:
    attempt_id: int
    number: int
    kind: str
    tier_index: int
    start_commit: str
    feedback: str | None
    calls_so_far: int
    run: int
    replay: list[JournalEntry]
    budget_usd: float | None
    original: OriginalJournal | None
    """For a ``merlin replay`` job: the original job's answers to this attempt."""
    agent: AgentDefinition | None = None


@dataclass(frozen=True)
class _AttemptEnd:
    """What the agent left: its summary, its error if any, its turns and transcript."""

    commit: str
    summary: str
    error: str | None
    turns: int
    transcript: list[dict[str, Any]]
    failure: FailureKind | None = None
    """Why the attempt failed, with ``error``: its model unusable, or a capability failure."""


def execute_step(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str
) -> Outcome:
    """Make the step's next attempt: run the agent in a worktree and commit its changes.

    ``token`` identifies this execution; it owns the step's lease once claimed.
    """
    with db.reader() as session:
        job, step = load_step(session, job_id, step_key)
        if job is None or step is None or job.status in FINAL_JOB_STATUSES:
            return Outcome.STOP
        if step.phase != Phase.ATTEMPT or step.status in FINISHED_STEP_STATUSES:
            return Outcome.STOP
        held = HeldStep.of(db, settings, job, step, token)
    return held.work(Phase.ATTEMPT, lambda heartbeat: _run_attempt(held, heartbeat))


def _run_attempt(held: HeldStep, heartbeat: Heartbeat) -> Outcome:
    plan, location, brief = _begin_attempt(held)
    repository = repository_of(location, held.settings)
    repository.have(held.job_id, plan.start_commit)
    brief = with_spec_constraints(brief, repository.path, plan.start_commit, held.config)
    try:
        end = _work_in_worktree(held, heartbeat, plan, brief, repository)
    except BudgetExceeded as exc:
        _stop_for_budget(held, plan.attempt_id, str(exc))
        return Outcome.STOP
    except JobCancelled:
        held.release()
        finalize_job(held.db, held.settings, held.job_id)
        return Outcome.STOP
    # Before verify can be queued: a verify worker elsewhere fetches the commit by this ref.
    # Only while we hold the step: a worker that lost it must not replace the new owner's.
    if heartbeat.lost:
        raise LeaseLost(f"step {held.step_key}: lease lost before publishing attempt {plan.number}")
    repository.publish(attempt_ref(held.job_id, held.step_key, plan.number), end.commit)
    ended = _record_attempt(held, plan, end)
    if ended:
        finalize_job(held.db, held.settings, held.job_id)
        return Outcome.STOP
    return Outcome.CONTINUE


def _work_in_worktree(
    held: HeldStep,
    heartbeat: Heartbeat,
    plan: _AttemptPlan,
    brief: StepBrief,
    repository: JobRepository,
) -> _AttemptEnd:
    """Run the agent on a worktree at the attempt's start, and commit what it changed."""

    def check_alive() -> None:
        if heartbeat.lost:
            raise LeaseLost(f"step {held.step_key}: lease lost during the attempt")
        if job_has_ended(held.db, held.job_id):
            raise JobCancelled(f"job {held.job_id} ended while step {held.step_key} was running")

    config, tier = held.config, held.config.tiers[plan.tier_index]
    excludes = write_excludes_file(held.settings.home_dir / "commit-excludes")
    guard = job_guard(held.db, held.job_id, plan.budget_usd, config.limits)
    name = f"{held.step_key}-{plan.number}"
    try:
        with held.checkout(repository, plan.start_commit, name) as checkout:
            worktree = checkout.worktree
            brief = with_instructions(brief, worktree, config)
            seqs = itertools.count(plan.calls_so_far)
            context = CallContext(held.job_id, held.step_id, plan.attempt_id, plan.run, tier)

            def on_call(turn: int, reply: Completion | None, error: BaseException | None) -> None:
                record_call(held.db, context, next(seqs), turn, reply, error)
                guard.release()  # the journal now holds the call's cost: its estimate goes

            def on_condense(done: Condensation) -> None:
                data: CondensedData = {"attempt": plan.number, "how": done.how,
                                       "before": done.before, "after": done.after,
                                       "forced": done.forced}  # fmt: skip
                with held.db.session() as session:
                    kind = EventKind.CONTEXT_CONDENSED
                    add_event(session, held.job_id, kind, done.describe(), held.step_key, data)

            def on_progress(messages: list[dict[str, Any]]) -> None:
                # The conversation so far, for `merlin logs --follow` and `merlin watch`.
                with held.db.session() as session:
                    attempt = session.get_one(Attempt, plan.attempt_id)
                    attempt.transcript = for_the_record(messages)

            summary, error, turns, writes = "", None, 0, True
            failure = FailureKind.CAPABILITY
            transcript: list[dict[str, Any]] = []
            try:
                # A live tier with no key or no server fails at once, with no call made.
                problem = None if plan.original else tier_access(tier)
                if problem:
                    raise ModelUnreachable(MODEL_UNREACHABLE + problem)
                call_model = Replayer(
                    plan.replay,
                    before_live=None if plan.original else guard.before_call,  # replays free
                    # A replay answers from its original only, never from the cache.
                    cache=ResponseCache(held.db)
                    if config.response_cache and not plan.original
                    else None,
                    live=plan.original or complete,
                )
                with open_step_tools(checkout, config, plan.agent) as toolbox:
                    writes, brief = can_write(toolbox), with_map(brief, tier, toolbox)
                    result = run_agent(
                        tier,
                        brief,
                        toolbox,
                        plan.feedback,
                        on_call,
                        check_alive,
                        limits=config.limits,
                        call_model=call_model,
                        transcript=transcript,
                        on_progress=on_progress,
                        on_condense=on_condense,
                    )
                summary, turns = result.summary, result.turns
                check_alive()
            except (AgentError, ToolSourceError) as exc:
                error = str(exc)
                if isinstance(exc, ModelUnreachable):
                    failure = FailureKind.ACCESS
            message = held.commit_subject(brief.description)
            text = f"{message}\n\nJob {held.job_id}, attempt {plan.number}."
            attempt = (plan.number, plan.start_commit)
            commit, error = commit_attempt(
                held, worktree, excludes, attempt, plan.agent, text, error
            )
            summary = marked_at(summary, repository.path, commit)  # citations checked
            edits = brief.step_type != StepType.VERIFY.value and writes  # a reviewer writes none
            if error is None and edits and same_tree(worktree, commit, plan.start_commit):
                error = NO_CHANGES.format(turns=turns)
    finally:
        guard.release_quietly()
    return _AttemptEnd(commit, summary, error, turns, transcript, failure if error else None)


def _record_attempt(held: HeldStep, plan: _AttemptPlan, end: _AttemptEnd) -> bool:
    """Record the attempt's commit and hand the step to verify; True if the job has ended."""
    with held.db.session() as session:
        ended = lock_job(session, held.job_id).status in FINAL_JOB_STATUSES
        if ended:  # cancelled meanwhile: keep the attempt for the record, verify nothing
            release_step(session, held.step_id, held.token)
        else:
            hand_off(session, held.step_id, held.token, Phase.VERIFY, held.settings.handoff_seconds)
        attempt = session.get_one(Attempt, plan.attempt_id)
        attempt.commit = end.commit
        attempt.summary = end.summary[:4000]
        attempt.transcript = for_the_record(end.transcript)
        attempt.turns = end.turns
        end_attempt(
            session, held.job_id, held.step_key, attempt, end.error, end.failure, job_ended=ended
        )
    return ended


def _stop_for_budget(held: HeldStep, attempt_id: int, reason: str) -> None:
    """End the job with status ``budget_exceeded``: no more calls are paid for."""
    with held.db.session() as session:
        release_step(session, held.step_id, held.token)
        attempt = session.get_one(Attempt, attempt_id)
        step = session.get_one(Step, held.step_id)
        stop_for_budget(session, held.job_id, step, attempt, reason)
    finalize_job(held.db, held.settings, held.job_id)


def _begin_attempt(held: HeldStep) -> tuple[_AttemptPlan, str, StepBrief]:
    """Create the attempt row (or resume the one a lost worker left running)."""
    with held.db.session() as session:
        settle(session, held.step_id, held.token)
        job = session.get_one(Job, held.job_id)
        step = session.get_one(Step, held.step_id)
        start_job(session, job, sandboxed=held.config.sandbox.mode is not SandboxMode.NONE)
        start_step(session, job, step)
        attempt = _open_attempt(session, held.config, job, step)
        session.flush()
        calls = session.scalar(
            select(func.count()).select_from(LlmCall).where(LlmCall.attempt_id == attempt.id)
        )
        plan = _AttemptPlan(
            attempt_id=attempt.id,
            number=attempt.number,
            kind=attempt.kind,
            tier_index=held.config.tier_index(attempt.tier),
            start_commit=attempt.start_commit,
            feedback=attempt.feedback,
            calls_so_far=calls or 0,
            run=attempt.runs,
            replay=replayable_calls(session, attempt.id),
            budget_usd=job.budget_usd,
            original=_original_journal(session, job, step, attempt),
            agent=stored_agent(step.agent_spec),
        )
        return plan, job.repo, step_brief(step)


def _open_attempt(session: Session, config: MerlinConfig, job: Job, step: Step) -> Attempt:
    """The attempt a lost worker left running, resumed; or a new one as the step planned."""
    attempts = list(step.attempts)
    latest = attempts[-1] if attempts else None
    if latest is not None and latest.status == AttemptStatus.RUNNING:
        latest.runs += 1
        message = f"attempt {latest.number} resumed after its worker was lost"
        number: AttemptData = {"attempt": latest.number}
        add_event(session, job.id, EventKind.ATTEMPT_RESUMED, message, step.key, number)
        return latest
    kind = AttemptKind(step.next_kind)
    tier = config.tiers[step.tier_index]
    if kind in (AttemptKind.ESCALATE, AttemptKind.INTEGRATE):
        step.base_commit = job.head_commit  # afresh: with the work of siblings that passed
    start = step.base_commit or job.head_commit
    if kind is AttemptKind.FIX and latest is not None:
        start = latest.commit or latest.start_commit
    attempt = Attempt(
        number=len(attempts) + 1,
        kind=kind.value,
        tier=tier.name,
        model=tier.model,
        status=AttemptStatus.RUNNING,
        start_commit=start,
        feedback=feedback_for(kind, attempts),
        runs=1,
    )
    step.attempts.append(attempt)
    add_event(
        session,
        job.id,
        EventKind.ATTEMPT_STARTED,
        f"attempt {attempt.number} ({kind}) on tier {tier.name}",
        step.key,
        {"attempt": attempt.number, "kind": kind.value, "tier": tier.name},
    )
    return attempt


def _original_journal(
    session: Session, job: Job, step: Step, attempt: Attempt
) -> OriginalJournal | None:
    """For a replay job, the original job's answers to the same attempt on the same tier."""
    if job.replay_of is None:
        return None
    where = f"step {step.key}, attempt {attempt.number} on tier {attempt.tier}"
    original = session.scalars(
        select(Attempt)
        .join(Step, Attempt.step_id == Step.id)
        .where(
            Step.job_id == job.replay_of,
            Step.key == step.key,
            Attempt.number == attempt.number,
            Attempt.tier == attempt.tier,
        )
    ).first()
    entries = replayable_calls(session, original.id, paid_only=False) if original else []
    return OriginalJournal(entries, where)
