"""The work of the step, verify and finalize tasks, over the store and git (no Celery).

Each function starts from the database: a task delivered twice, or again after a crash,
finds out there what already happened and does only what is left. Every write that ends
a phase is conditional on still holding the step's lease (see ``merlin_flow.leases``).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from merlin_flow.agent import StepBrief, first_messages, run_agent
from merlin_flow.budget import BudgetGuard
from merlin_flow.config import MerlinConfig, SandboxMode
from merlin_flow.credentials import tier_access
from merlin_flow.environment import (
    BuiltEnvironment,
    ensure_environment,
    prepare_worktree,
    step_confinement,
)
from merlin_flow.errors import (
    AgentError,
    BudgetExceeded,
    GitError,
    JobCancelled,
    LeaseLost,
    ModelUnreachable,
    RemoteUnavailable,
    SandboxUnavailable,
    SetupFailed,
)
from merlin_flow.escalation import (
    MODEL_UNREACHABLE,
    Action,
    AttemptKind,
    Decision,
    decide,
    failure_of,
    failure_reason,
    feedback_for,
)
from merlin_flow.journal import (
    CallContext,
    JournalEntry,
    Replayer,
    ResponseCache,
    SourceJournal,
    record_call,
    replayable_calls,
)
from merlin_flow.leases import QUEUED, Heartbeat, claim, queued_values
from merlin_flow.llm import Completion, complete
from merlin_flow.process import CommandResult
from merlin_flow.repository import JobRepository, repository_of
from merlin_flow.settings import Settings
from merlin_flow.store import Attempt, Database, Event, Job, LlmCall, Step, utcnow
from merlin_flow.tasklist import FINISHED_STEP_STATUSES, StepStatus, StepType
from merlin_flow.tools import TOOL_SCHEMAS, Toolbox
from merlin_flow.verify import run_exit_command
from merlin_flow.workspace import (
    add_worktree,
    attempt_ref,
    commit_all,
    diff,
    remove_worktree,
    same_tree,
    write_excludes_file,
)

log = logging.getLogger(__name__)

TRANSCRIPT_CHARS = 8000
"""Longest message text kept in an attempt's transcript."""
SANDBOX_OFF_WARNING = (
    'warning: [sandbox] mode = "none": this job\'s commands run unconfined, as the '
    "worker's user, with its files, network and environment in reach (docs/security.md)"
)
NO_CHANGES = (
    "the attempt changed no file: the model finished after {turns} turn(s) without "
    "editing anything, so there was nothing to verify"
)
"""The error of an attempt that committed nothing (except on a Verify step)."""
FINAL_JOB_STATUSES = frozenset({"completed", "failed", "cancelled", "budget_exceeded"})


class Outcome(StrEnum):
    """What the task wrapper does after the work."""

    CONTINUE = "continue"
    """Done; let the chain go on."""
    RETRY = "retry"
    """Verification failed and another attempt is planned: run step + verify again."""
    STOP = "stop"
    """Nothing (more) for this message to do: stop the chain."""


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
    source: SourceJournal | None
    """For a ``merlin replay`` job: the original job's answers to this attempt."""


def _load(session: Session, job_id: str, step_key: str) -> tuple[Job | None, Step | None]:
    job = session.get(Job, job_id)
    if job is None:
        return None, None
    step = session.scalars(select(Step).where(Step.job_id == job_id, Step.key == step_key)).first()
    return job, step


def _settle(session: Session, step_id: int, token: str, **values: Any) -> None:
    """Write ``values`` to the step only while we hold its lease; LeaseLost otherwise.

    With no values it only checks (and row-locks) our lease for the transaction.
    """
    result = session.execute(
        update(Step)
        .where(Step.id == step_id, Step.lease_owner == token)
        .values(**(values or {"lease_owner": token}))
        .execution_options(synchronize_session=False)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(f"step {step_id}: lease taken over by another worker")


def execute_step(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str
) -> Outcome:
    """Make the step's next attempt: run the agent in a worktree and commit its changes.

    ``token`` identifies this execution; it owns the step's lease once claimed.
    """
    with db.reader() as session:
        job, step = _load(session, job_id, step_key)
        if job is None or step is None or job.status in FINAL_JOB_STATUSES:
            return Outcome.STOP
        if step.phase != "attempt" or step.status in FINISHED_STEP_STATUSES:
            return Outcome.STOP
        step_id = step.id
        config = MerlinConfig.model_validate(job.config)
    if not claim(db, step_id, "attempt", token, config.limits.lease_seconds):
        return Outcome.STOP
    try:
        with Heartbeat(db, step_id, token, config.limits.lease_seconds) as heartbeat:
            return _run_attempt(db, settings, job_id, step_key, step_id, token, config, heartbeat)
    except LeaseLost as exc:
        log.warning("%s", exc)
        return Outcome.STOP
    except (SetupFailed, SandboxUnavailable) as exc:
        # A fault of the project's environment or of this machine, not of the step: the
        # job fails once, with the reason, instead of every attempt failing the same way.
        fail_job(db, settings, job_id, step_key, token, str(exc))
        return Outcome.STOP


def _worktree_path(settings: Settings, job_id: str, name: str, token: str) -> Path:
    # The token keeps apart the worktrees of a worker that lost its lease and of the
    # worker that took the step over: neither can delete the other's.
    return settings.worktrees_dir / job_id / f"{name}-{token.rsplit(':', 1)[-1]}"


def _run_attempt(
    db: Database,
    settings: Settings,
    job_id: str,
    step_key: str,
    step_id: int,
    token: str,
    config: MerlinConfig,
    heartbeat: Heartbeat,
) -> Outcome:
    def check_alive() -> None:
        if heartbeat.lost:
            raise LeaseLost(f"step {step_key}: lease lost during the attempt")
        if job_has_ended(db, job_id):
            raise JobCancelled(f"job {job_id} ended while step {step_key} was running")

    plan, location, brief = _begin_attempt(db, job_id, step_id, token, config)
    tier = config.tiers[plan.tier_index]
    worktree = _worktree_path(settings, job_id, f"{step_key}-{plan.number}", token)
    excludes = write_excludes_file(settings.home_dir / "commit-excludes")
    source = repository_of(location, settings)
    source.have(job_id, plan.start_commit)
    environment = _environment(db, settings, config, source, job_id, step_key, plan.start_commit)
    add_worktree(source.path, worktree, plan.start_commit)
    prepare_worktree(environment, worktree)
    try:
        seqs = itertools.count(plan.calls_so_far)
        guard = BudgetGuard(db, job_id, plan.budget_usd, config.limits.expected_completion_tokens)
        context = CallContext(job_id, step_id, plan.attempt_id, plan.run, tier)

        def on_call(turn: int, reply: Completion | None, error: BaseException | None) -> None:
            record_call(db, context, next(seqs), turn, reply, error)

        summary, error, turns = "", None, 0
        transcript: list[dict[str, Any]] = []
        try:
            # A live tier with no key or no server fails at once, with no call made.
            problem = None if plan.source else tier_access(tier)
            if problem:
                raise ModelUnreachable(MODEL_UNREACHABLE + problem)
            result = run_agent(
                tier,
                brief,
                Toolbox(
                    worktree,
                    config.limits.tool_command_timeout,
                    step_confinement(worktree, environment, config),
                    config.sandbox,
                ),
                plan.feedback,
                config.limits.max_turns,
                on_call,
                check_alive,
                limits=config.limits,
                call_model=Replayer(
                    plan.replay,
                    before_live=None if plan.source else guard.before_call,  # replays are free
                    # A replay answers from its original only, never from the cache.
                    cache=ResponseCache(db) if config.response_cache and not plan.source else None,
                    live=plan.source or complete,
                ),
                transcript=transcript,
            )
            summary, turns = result.summary, result.turns
            check_alive()
        except AgentError as exc:
            error = str(exc)
        except BudgetExceeded as exc:
            _stop_for_budget(db, settings, job_id, step_id, plan.attempt_id, token, str(exc))
            return Outcome.STOP
        except JobCancelled:
            _abandon(db, settings, job_id, step_id, token)
            return Outcome.STOP
        message = f"merlin({step_key}): {brief.description.splitlines()[0][:72]}"
        commit = commit_all(
            worktree, f"{message}\n\nJob {job_id}, attempt {plan.number}.", excludes
        )
        edits = brief.step_type != StepType.VERIFY.value
        if error is None and edits and same_tree(worktree, commit, plan.start_commit):
            error = NO_CHANGES.format(turns=turns)
    finally:
        remove_worktree(source.path, worktree)
    # Before verify can be queued: a verify worker elsewhere fetches the commit by this ref.
    # Only while we hold the step: a worker that lost it must not replace the new owner's.
    if heartbeat.lost:
        raise LeaseLost(f"step {step_key}: lease lost before publishing attempt {plan.number}")
    source.publish(attempt_ref(job_id, step_key, plan.number), commit)
    with db.session() as session:
        ended = _lock_job(session, job_id).status in FINAL_JOB_STATUSES
        if ended:  # cancelled meanwhile: keep the attempt for the record, verify nothing
            _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        else:
            _settle(
                session, step_id, token, phase="verify", **queued_values(settings.handoff_seconds)
            )
        attempt = session.get_one(Attempt, plan.attempt_id)
        attempt.commit = commit
        attempt.summary = summary[:4000]
        attempt.transcript = _for_the_record(transcript)
        attempt.turns = turns
        attempt.status = "error" if error else "committed"
        attempt.error = error
        if ended:
            attempt.status = "cancelled"
        if error or ended:
            attempt.finished_at = utcnow()
        outcome = f"failed: {error}" if error else f"committed {commit[:10]}"
        event = "attempt_error" if error else "attempt_committed"
        add_event(
            session,
            job_id,
            event,
            f"attempt {plan.number} {outcome}",
            step_key,
            attempt=plan.number,
        )
    if ended:
        finalize_job(db, settings, job_id)
        return Outcome.STOP
    return Outcome.CONTINUE


def _environment(
    db: Database,
    settings: Settings,
    config: MerlinConfig,
    source: JobRepository,
    job_id: str,
    step_key: str,
    commit: str,
) -> BuiltEnvironment | None:
    """The project's environment at ``commit``, built (and recorded) if it is new."""
    name = source.location.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    environment = ensure_environment(
        settings, config, source.path, commit, name.removesuffix(".git"), source.location
    )
    if environment is not None and environment.built:
        with db.session() as session:
            add_event(
                session,
                job_id,
                "environment_built",
                f"environment {environment.path.name} built in {environment.seconds:.1f} s",
                step_key,
                path=str(environment.path),
            )
    return environment


def _lock_job(session: Session, job_id: str) -> Job:
    """The job's row, locked for this transaction (on Postgres; SQLite serializes writers).

    Taken before any step row, as ``cancel_job`` does, so that two transactions never
    wait on each other in opposite orders.
    """
    return session.get_one(Job, job_id, with_for_update=True)


def _for_the_record(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation without the system prompt, long texts cut for the database."""
    kept = []
    for message in messages:
        if message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str) and len(content) > TRANSCRIPT_CHARS:
            message = {**message, "content": content[:TRANSCRIPT_CHARS] + "\n[... cut]"}
        kept.append(message)
    return kept


def job_has_ended(db: Database, job_id: str) -> bool:
    """True once the job has a final status (cancelled while its step was running...)."""
    with db.reader() as session:
        return session.scalar(select(Job.status).where(Job.id == job_id)) in FINAL_JOB_STATUSES


def _abandon(db: Database, settings: Settings, job_id: str, step_id: int, token: str) -> None:
    """Stop working on a step of a job that has ended: the branch does not move."""
    with db.session() as session:
        _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
    finalize_job(db, settings, job_id)


def _stop_for_budget(
    db: Database,
    settings: Settings,
    job_id: str,
    step_id: int,
    attempt_id: int,
    token: str,
    reason: str,
) -> None:
    """End the job with status ``budget_exceeded``: no more calls are paid for."""
    with db.session() as session:
        _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        attempt = session.get_one(Attempt, attempt_id)
        attempt.status = "error"
        attempt.error = reason
        attempt.finished_at = utcnow()
        step = session.get_one(Step, step_id)
        end_job_in_session(session, job_id, step, reason, status="budget_exceeded")
    finalize_job(db, settings, job_id)


def _begin_attempt(
    db: Database, job_id: str, step_id: int, token: str, config: MerlinConfig
) -> tuple[_AttemptPlan, str, StepBrief]:
    """Create the attempt row (or resume the one a lost worker left running)."""
    now = utcnow()
    with db.session() as session:
        _settle(session, step_id, token)
        job = session.get_one(Job, job_id)
        step = session.get_one(Step, step_id)
        if job.status == "pending":
            job.status = "running"
            job.started_at = now
            add_event(session, job_id, "job_started", "job started")
            if config.sandbox.mode is SandboxMode.NONE:
                add_event(session, job_id, "sandbox_disabled", SANDBOX_OFF_WARNING)
        if step.status == StepStatus.PENDING:
            step.status = StepStatus.IN_PROGRESS
            step.started_at = now
            step.base_commit = job.head_commit
            add_event(session, job_id, "step_started", f"step {step.key} started", step.key)
        attempts = list(step.attempts)
        latest = attempts[-1] if attempts else None
        if latest is not None and latest.status == "running":
            attempt = latest
            attempt.runs += 1
            add_event(
                session,
                job_id,
                "attempt_resumed",
                f"attempt {attempt.number} resumed after its worker was lost",
                step.key,
                attempt=attempt.number,
            )
        else:
            kind = AttemptKind(step.next_kind)
            tier = config.tiers[step.tier_index]
            start = step.base_commit or job.head_commit
            if kind is AttemptKind.FIX and latest is not None:
                start = latest.commit or latest.start_commit
            attempt = Attempt(
                number=len(attempts) + 1,
                kind=kind.value,
                tier=tier.name,
                model=tier.model,
                status="running",
                start_commit=start,
                feedback=feedback_for(kind, attempts),
                runs=1,
            )
            step.attempts.append(attempt)
            add_event(
                session,
                job_id,
                "attempt_started",
                f"attempt {attempt.number} ({kind}) on tier {tier.name}",
                step.key,
                attempt=attempt.number,
                kind=kind.value,
                tier=tier.name,
            )
        session.flush()
        calls = session.scalar(
            select(func.count()).select_from(LlmCall).where(LlmCall.attempt_id == attempt.id)
        )
        plan = _AttemptPlan(
            attempt_id=attempt.id,
            number=attempt.number,
            kind=attempt.kind,
            tier_index=next(i for i, t in enumerate(config.tiers) if t.name == attempt.tier),
            start_commit=attempt.start_commit,
            feedback=attempt.feedback,
            calls_so_far=calls or 0,
            run=attempt.runs,
            replay=replayable_calls(session, attempt.id),
            budget_usd=job.budget_usd,
            source=_source_journal(session, job, step, attempt),
        )
        brief = StepBrief(
            step.key, step.step_type, step.description, step.verification, step.exit_command
        )
        return plan, job.repo, brief


def _source_journal(
    session: Session, job: Job, step: Step, attempt: Attempt
) -> SourceJournal | None:
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
    return SourceJournal(entries, where)


def verify_step(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str
) -> Outcome:
    """Run the exit command on the last attempt's commit and decide what follows."""
    with db.reader() as session:
        job, step = _load(session, job_id, step_key)
        if job is None or step is None or job.status in FINAL_JOB_STATUSES:
            return Outcome.STOP
        if step.phase != "verify":
            return Outcome.STOP
        step_id = step.id
        config = MerlinConfig.model_validate(job.config)
        location, branch = job.repo, job.branch
    source = repository_of(location, settings)
    if not claim(db, step_id, "verify", token, config.limits.lease_seconds):
        return Outcome.STOP
    try:
        with Heartbeat(db, step_id, token, config.limits.lease_seconds) as heartbeat:
            with db.reader() as session:
                attempt = session.get_one(Step, step_id).attempts[-1]
                attempt_id, number, status = attempt.id, attempt.number, attempt.status
                commit, command = attempt.commit, attempt.step.exit_command
            exit_code: int | None = None
            output = ""
            if status == "committed" and commit:
                name = f"{step_key}-{number}-verify"
                worktree = _worktree_path(settings, job_id, name, token)
                source.have(job_id, commit)
                try:
                    result = _verify_in_worktree(
                        db, settings, config, source, job_id, step_key, commit, worktree, command
                    )
                except SetupFailed as exc:
                    # The attempt's commit changed the files setup depends on, and setup
                    # no longer succeeds: the attempt failed, not the job (setup passed at
                    # the step's start commit before the attempt ran).
                    result = CommandResult(1, str(exc), timed_out=False, duration=0.0)
                exit_code, output, passed = result.exit_code, result.output_tail, result.ok
            else:
                passed = status == "passed"
            if heartbeat.lost:
                raise LeaseLost(f"step {step_key}: lease lost during verification")
        # A job cancelled meanwhile is checked by _pass and _fail, under the job's lock.
        verdict = _Verdict(job_id, step_id, attempt_id, token, exit_code, output)
        if passed:
            return _pass(db, settings, verdict, source, branch)
        return _fail(db, settings, verdict, config)
    except LeaseLost as exc:
        log.warning("%s", exc)
        return Outcome.STOP
    except (SetupFailed, SandboxUnavailable) as exc:
        fail_job(db, settings, job_id, step_key, token, str(exc))
        return Outcome.STOP


def _verify_in_worktree(
    db: Database,
    settings: Settings,
    config: MerlinConfig,
    source: JobRepository,
    job_id: str,
    step_key: str,
    commit: str,
    worktree: Path,
    command: str,
) -> CommandResult:
    """Run the exit command on ``commit``, in its environment, in a worktree of its own."""
    environment = _environment(db, settings, config, source, job_id, step_key, commit)
    try:
        add_worktree(source.path, worktree, commit)
        prepare_worktree(environment, worktree)
        return run_exit_command(command, step_confinement(worktree, environment, config), config)
    finally:
        remove_worktree(source.path, worktree)


@dataclass(frozen=True)
class _Verdict:
    """The outcome of one verification, and who holds the step while recording it."""

    job_id: str
    step_id: int
    attempt_id: int
    token: str
    exit_code: int | None  # None: the exit command did not run (agent error, or re-recording)
    output: str

    def record_on(self, attempt: Attempt) -> None:
        if self.exit_code is not None:
            attempt.exit_code, attempt.output_tail = self.exit_code, self.output
        attempt.finished_at = attempt.finished_at or utcnow()


def _pass(
    db: Database, settings: Settings, verdict: _Verdict, source: JobRepository, branch: str
) -> Outcome:
    job_id, step_id, token = verdict.job_id, verdict.step_id, verdict.token
    with db.session() as session:
        job = _lock_job(session, job_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        commit = attempt.commit or attempt.start_commit
        _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        step = session.get_one(Step, step_id)
        if job.status in FINAL_JOB_STATUSES:  # cancelled meanwhile: the branch stays
            verdict.record_on(attempt)
            attempt.status = "cancelled"
        # The branch moves inside the transaction: if the database write then fails, the
        # lease expires, verify runs again and finds the branch already at `commit`.
        elif not source.advance(branch, commit, job.head_commit) and (
            source.branch_head(branch) != commit
        ):
            reason = (
                f"step {step.key} passed, but the job branch {branch} was moved by someone "
                f"else (expected it at {job.head_commit[:10]}); not overwriting it"
            )
            fail_job_in_session(session, job_id, step, reason)
        else:
            _complete(session, settings, job, step, attempt, verdict, commit)
            return Outcome.CONTINUE
    finalize_job(db, settings, job_id)
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
    attempt.status = "passed"
    step.status = StepStatus.COMPLETED
    step.result = attempt.summary or f"verified by `{step.exit_command}`"
    step.error = None
    step.finished_at = now
    job.head_commit = commit
    job.updated_at = now
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


def _fail(db: Database, settings: Settings, verdict: _Verdict, config: MerlinConfig) -> Outcome:
    job_id, step_id, token = verdict.job_id, verdict.step_id, verdict.token
    with db.session() as session:
        ended = _lock_job(session, job_id).status in FINAL_JOB_STATUSES
        step = session.get_one(Step, step_id)
        attempt = session.get_one(Attempt, verdict.attempt_id)
        verdict.record_on(attempt)
        if attempt.status != "error":
            attempt.status = "failed"
        if verdict.exit_code:
            add_event(
                session,
                job_id,
                "verify_failed",
                _verify_failure(job_id, step, verdict),
                step.key,
                attempt=attempt.number,
                exit_code=verdict.exit_code,
            )
        session.flush()
        if ended:  # cancelled meanwhile: no fix, no escalation
            _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        elif _plan_next(db, session, settings, verdict, step, attempt, config):
            return Outcome.RETRY
    finalize_job(db, settings, job_id)
    return Outcome.STOP


def _verify_failure(job_id: str, step: Step, verdict: _Verdict) -> str:
    """A failed exit command in a few lines: the command, its exit code, its last lines."""
    lines = [line for line in verdict.output.rstrip().splitlines() if line.strip()][-5:]
    tail = "".join(f"\n    {line}" for line in lines)
    return (
        f"`{step.exit_command}` exited with code {verdict.exit_code}:{tail}"
        f"\n    (all output: merlin logs {job_id} --step {step.key})"
    )


def _plan_next(
    db: Database,
    session: Session,
    settings: Settings,
    verdict: _Verdict,
    step: Step,
    attempt: Attempt,
    config: MerlinConfig,
) -> bool:
    """Plan a fix or an escalation (True), or end the job (False).

    The job ends when the escalation cannot be paid for, or when every tier failed.
    """
    job_id, step_id, token = verdict.job_id, verdict.step_id, verdict.token
    nxt = decide(
        failure_of(attempt),
        attempts=list(step.attempts),
        tier_index=step.tier_index,
        next_tier=config.next_tier(step.tier_index, StepType(step.step_type)),
        limits=config.limits,
    )
    over_budget = _escalation_over_budget(db, session, job_id, step, nxt, config)
    if over_budget is not None:
        _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        end_job_in_session(session, job_id, step, over_budget, status="budget_exceeded")
        return False
    if nxt.action not in (Action.FIX, Action.ESCALATE):
        _settle(session, step_id, token, phase="done", lease_owner=None, lease_expires_at=None)
        reason = f"step {step.key} failed on every tier: {failure_reason(attempt)}"
        fail_job_in_session(session, job_id, step, reason)
        return False
    to_tier = config.tiers[nxt.tier_index].name
    add_event(
        session,
        job_id,
        "escalated" if nxt.action is Action.ESCALATE else "fix_planned",
        f"attempt {attempt.number} failed ({nxt.reason}); "
        f"next: {nxt.attempt_kind} on tier {to_tier}",
        step.key,
        from_tier=config.tiers[step.tier_index].name,
        to_tier=to_tier,
        reason=nxt.reason[:2000],
    )
    _settle(
        session,
        step_id,
        token,
        phase="attempt",
        next_kind=nxt.attempt_kind.value,
        tier_index=nxt.tier_index,
        **queued_values(settings.handoff_seconds),
    )
    return True


def _escalation_over_budget(
    db: Database, session: Session, job_id: str, step: Step, nxt: Decision, config: MerlinConfig
) -> str | None:
    """Why the planned escalation cannot be paid for, or None when it can."""
    budget = session.get_one(Job, job_id).budget_usd
    if nxt.action is not Action.ESCALATE or budget is None:
        return None
    brief = StepBrief(
        step.key, step.step_type, step.description, step.verification, step.exit_command
    )
    messages = first_messages(brief, feedback_for(AttemptKind.ESCALATE, list(step.attempts)))
    guard = BudgetGuard(db, job_id, budget, config.limits.expected_completion_tokens)
    try:
        guard.check(config.tiers[nxt.tier_index], messages, TOOL_SCHEMAS, "escalating")
    except BudgetExceeded as exc:
        return f"step {step.key} stopped before escalating: {exc}"
    return None


def fail_job_in_session(session: Session, job_id: str, step: Step | None, reason: str) -> None:
    """Mark a step (if given) and its job failed, within an open session."""
    end_job_in_session(session, job_id, step, reason, status="failed")


def end_job_in_session(
    session: Session, job_id: str, step: Step | None, reason: str, status: str
) -> None:
    """End a job early (``failed``, ``budget_exceeded``): its step fails, later ones skip."""
    now = utcnow()
    if step is not None:
        step.status = StepStatus.FAILED
        step.error = reason
        step.finished_at = now
        step.phase = "done"
        for attempt in step.attempts:  # one a lost worker left running ends with the step
            if attempt.status in ("running", "committed"):
                attempt.status = "error"
                attempt.error = attempt.error or reason
                attempt.finished_at = now
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
                later.phase = "done"
                later.lease_owner = later.lease_expires_at = None


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
    source, unreadable = _patch_source(location, settings, job_id, base, head)
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
            done = all(s in (StepStatus.COMPLETED, StepStatus.SKIPPED) for s in statuses)
            if not done:
                return job.status  # a stale finalize: steps are still running
            job.status = "completed"
        elif any(_held_by_a_worker(step) for step in _lock_steps(session, job_id)):
            return job.status  # ended (cancelled) while a worker runs a step: it will finalize
        else:
            _close_unfinished_steps(job)
        patch = settings.jobs_dir / job_id / f"{job_id}.patch"
        patch.parent.mkdir(parents=True, exist_ok=True)
        if source is None:
            patch.write_text("")
        else:
            source.have(job_id, job.base_commit, job.head_commit)
            patch.write_text(diff(source.path, job.base_commit, job.head_commit))
            _remove_leftover_worktrees(source.path, settings.worktrees_dir / job_id)
        patch.with_name("summary.md").write_text(_summary(job, unreadable))
        job.patch_path = str(patch)
        job.finished_at = job.updated_at = utcnow()
        add_event(session, job_id, "job_finished", f"job {job.status}", patch=str(patch))
        return job.status


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
        step.phase = "done"
        step.finished_at = now
        step.lease_owner = step.lease_expires_at = None
        for attempt in step.attempts:
            if attempt.status in ("running", "committed"):
                attempt.status = "cancelled"
                attempt.finished_at = now


def _remove_leftover_worktrees(repo: Path, folder: Path) -> None:
    """Remove worktrees that workers killed mid-task left behind."""
    if folder.is_dir():
        for leftover in folder.iterdir():
            remove_worktree(repo, leftover)
        folder.rmdir()


def _patch_source(
    location: str, settings: Settings, job_id: str, base: str, head: str
) -> tuple[JobRepository | None, str | None]:
    """The repository to write the patch from, with its commits; or None and why not.

    A remote that does not answer raises (the finalize runs again later); one that
    refuses for good (deleted, no access) must not keep the job from ending.
    """
    try:
        source = repository_of(location, settings)
        source.have(job_id, base, head)  # fetched before finalize takes the job's lock
    except RemoteUnavailable:
        raise
    except GitError as exc:
        log.warning("job %s: no patch: %s", job_id, exc)
        return None, str(exc)
    return source, None


def _summary(job: Job, patch_error: str | None = None) -> str:
    """A Markdown summary of a finished job: outcome, and each step's attempts."""
    lines = [
        f"# {job.title}",
        "",
        f"- job: {job.id}, status: **{job.status}**",
        f"- repository: {job.repo}",
        f"- branch: {job.branch} ({job.base_commit[:10]}..{job.head_commit[:10]})",
    ]
    if job.error:
        lines.append(f"- error: {job.error}")
    if patch_error:
        lines.append(f"- patch: not written, the repository could not be read: {patch_error}")
    lines += ["", "| step | type | status | attempts (kind@tier: exit code) |", "|---|---|---|---|"]
    for step in job.steps:
        attempts = ", ".join(
            f"{a.kind}@{a.tier}: {a.exit_code if a.exit_code is not None else a.status}"
            for a in step.attempts
        )
        lines.append(f"| {step.key} | {step.step_type} | {step.status} | {attempts} |")
    return "\n".join(lines) + "\n"


def remaining_tasks(db: Database, job_id: str) -> list[tuple[str, str | None]]:
    """What is left of a job as (task, step key) pairs: ``step``, ``verify``, ``finalize``."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None or job.finished_at is not None:
            return []
        tasks: list[tuple[str, str | None]] = []
        if job.status not in FINAL_JOB_STATUSES:
            for step in job.steps:
                if step.status in FINISHED_STEP_STATUSES:
                    continue
                if not tasks and step.phase == "verify":
                    tasks.append(("verify", step.key))
                    continue
                tasks += [("step", step.key), ("verify", step.key)]
        tasks.append(("finalize", None))
        return tasks
