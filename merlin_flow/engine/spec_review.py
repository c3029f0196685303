"""The spec check as a verification makes it: one journaled call on the passed attempt.

After an attempt's exit command passed, its diff is checked against the constraints of
the relevant specs (``merlin_flow.planning.spec_check`` holds the policy, the prompt and the
reading of the answer). The call is journaled like an attempt's, paid from the job's
budget, and answered from the original's journal in a ``merlin replay`` job.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from merlin_flow.config import Tier
from merlin_flow.engine.budget import job_guard
from merlin_flow.engine.held_step import HeldStep
from merlin_flow.models.journal import CallContext, record_call
from merlin_flow.models.llm import Completion, complete
from merlin_flow.planning.spec_check import (
    CHECK_CHARS,
    CheckResult,
    Policy,
    SpecOutcome,
    parse_answer,
    policy,
    run_check,
    spec_constraints,
    with_citations,
)
from merlin_flow.store import Attempt, Job, LlmCall, Step
from merlin_flow.workspace.citations import reader_for_commit
from merlin_flow.workspace.git import diff
from merlin_flow.workspace.repository import JobRepository

SPEC_CHECK_TURN = -1
"""The journal's turn for the spec check's call: after the attempt, never replayed."""


def review_attempt(
    held: HeldStep, attempt_id: int, repository: JobRepository
) -> SpecOutcome | None:
    """Check the passed attempt's diff against the relevant specs; None if none applies.

    The diff is the step's whole change (its base commit to the attempt's commit): a fix
    attempt is checked with the changes of the attempts it builds on.
    """
    with held.db.reader() as session:
        job = session.get_one(Job, held.job_id)
        step = session.get_one(Step, held.step_id)
        attempt = session.get_one(Attempt, attempt_id)
        steps = job.tasklist.get("steps", [])
        flagged = any(s.get("id") == step.key and s.get("spec_check") for s in steps)
        base, commit = step.base_commit or attempt.start_commit, attempt.commit
        # The specs a step is held to are the job's base's: not what an earlier step of
        # the job (a model) wrote into them.
        specs_at = job.base_commit or base
        description, budget, run = step.description, job.budget_usd, attempt.runs
        original = _original_check(session, job, step, attempt) if job.replay_of else None
        replaying = job.replay_of is not None
    mode = policy(held.config, flagged)
    if mode is Policy.OFF or not commit:
        return None
    constraints, paths = spec_constraints(
        repository.path, specs_at, held.config, description, CHECK_CHARS
    )
    patch = diff(repository.path, base, commit)
    if not constraints or not patch.strip():
        return None
    tier = held.config.spec_check_tier()
    guard = job_guard(held.db, held.job_id, budget, held.config.limits)
    context = CallContext(held.job_id, held.step_id, attempt_id, run, tier)

    def journaled(tier: Tier, messages: list[dict[str, Any]], tools: list[Any]) -> Completion:
        guard.before_call(tier, messages, tools)  # refused: the check could not run
        with held.db.reader() as session:
            last = session.scalar(
                select(func.max(LlmCall.seq)).where(LlmCall.attempt_id == attempt_id)
            )
        seq = 0 if last is None else last + 1
        try:
            reply = complete(tier, messages, tools)
        except Exception as exc:
            record_call(held.db, context, seq, SPEC_CHECK_TURN, None, exc)
            guard.release()  # after the journal holds the call: never counted zero times
            raise
        record_call(held.db, context, seq, SPEC_CHECK_TURN, reply, None)
        guard.release()
        return reply

    if replaying:  # a replay answers from its original's journal only: no live call
        missing = "spec check could not run: the original job made no such check"
        result = parse_answer(original) if original is not None else CheckResult(note=missing)
    else:
        result = run_check(tier, constraints, patch, journaled)
    read = reader_for_commit(repository.path, commit)
    result = with_citations(result, read, held.config.agents.citations)
    return SpecOutcome(mode, tuple(paths), result)


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
