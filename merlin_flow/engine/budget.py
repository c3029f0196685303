"""Job budgets: the next call's cost is estimated, held, and refused if it would overrun.

A job's budget (``--budget`` or ``budget_usd`` in merlin.toml) is checked before every
live model call and before every escalation. The estimate prices the prompt that is
about to be sent (its tokens counted as the provider will count them) plus the expected
completion (the mean completion of the job's earlier calls, or
``limits.expected_completion_tokens`` before the first). A call is refused when the
job's spend so far, plus what its calls in flight hold, plus that estimate exceeds the
budget, so a job never goes over its budget by more than its calls' estimation errors.

Steps of one job run at once, so two calls could both pass the check and both spend
the budget's last dollar. Each live call therefore *holds* its estimate (a row of
``budget_holds``) from its check until it is paid: the check and the hold are one
transaction under the job's row lock (on SQLite every writer is serialized anyway), so
of two calls that only one of fits, the second sees the first's hold and is refused.
The caller releases the hold (``BudgetGuard.release``) once the call's journal row,
which carries its cost, is written; a guard's next call releases its previous hold
too. A hold its worker never released (killed mid-call) stops counting at its
``expires_at``. The estimate itself is computed before the lock is taken.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.feedback import feedback_for
from merlin_flow.errors import BudgetExceeded, InputError
from merlin_flow.failures import Action, AttemptKind, Decision
from merlin_flow.models.endpoints import describe
from merlin_flow.models.llm import call_price, is_priced, litellm_module
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.store import BudgetHold, Database, Job, LlmCall, Step, utcnow
from merlin_flow.tasklist import TaskList

log = logging.getLogger(__name__)

HOLD_SECONDS = 900.0
"""How long an unreleased hold counts: longer than any one model call should take."""


def prompt_tokens(tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """Tokens of the prompt as the tier's provider counts them (approximately)."""
    if tier.is_scripted:
        return count_tokens(conversation_text(messages))
    try:
        return int(litellm_module().token_counter(model=tier.model, messages=messages, tools=tools))
    except Exception:  # an unknown tokenizer: fall back to 4 characters a token
        return count_tokens(conversation_text(messages))


def require_priced_tiers(
    config: MerlinConfig, tasklist: TaskList, budget_usd: float | None
) -> None:
    """InputError when a budget is set and a tier the job may run on has no known price.

    A budget cannot limit what it cannot price: the job would spend freely on that tier.
    """
    if budget_usd is None:
        return
    types = {step.step_type for step in tasklist.steps}
    unpriced = [
        tier
        for tier in config.tiers
        if any(tier.serves(step_type) for step_type in types) and not is_priced(tier)
    ]
    if unpriced:
        lines = "\n".join(f"  - {describe(tier)}" for tier in unpriced)
        raise InputError(
            f"a budget of ${budget_usd:g} cannot limit tiers whose price is unknown:\n{lines}\n"
            "set price_in and price_out (USD per million tokens; 0 for a free local model) "
            "on each in merlin.toml, or run without a budget"
        )


def spent(db: Database, job_id: str) -> float:
    """What the job has paid for so far (its calls of known price)."""
    with db.reader() as session:
        total = session.scalar(
            select(func.coalesce(func.sum(LlmCall.cost_usd), 0.0)).where(LlmCall.job_id == job_id)
        )
    return float(total or 0.0)


def expected_completion(db: Database, job_id: str, default: int) -> int:
    """Completion tokens to expect from the next call: the job's mean so far."""
    with db.reader() as session:
        mean = session.scalar(
            select(func.avg(LlmCall.completion_tokens)).where(
                LlmCall.job_id == job_id, LlmCall.error.is_(None), LlmCall.replayed.is_(False)
            )
        )
    return round(mean) if mean is not None else default


def _committed(
    session: Session, job_id: str, now: datetime, mine: int | None
) -> tuple[float, float]:
    """(paid, held): the job's spend and its unexpired holds but ``mine``, in one statement.

    One statement reads both in one snapshot (also under Postgres' READ COMMITTED): a
    call journaled and released in between is counted once, never zero times.
    """
    paid = select(func.coalesce(func.sum(LlmCall.cost_usd), 0.0)).where(LlmCall.job_id == job_id)
    live = [BudgetHold.job_id == job_id, BudgetHold.expires_at > now]
    if mine is not None:
        live.append(BudgetHold.id != mine)
    held = select(func.coalesce(func.sum(BudgetHold.amount_usd), 0.0)).where(*live)
    row = session.execute(select(paid.scalar_subquery(), held.scalar_subquery())).one()
    return float(row[0] or 0.0), float(row[1] or 0.0)


class BudgetGuard:
    """Refuses a call the job's budget cannot pay for; holds the estimate of one it can.

    One guard serves one sequence of calls (an attempt, a spec check): its calls never
    overlap, and it keeps at most one hold, that of its latest call.
    """

    def __init__(
        self,
        db: Database,
        job_id: str,
        budget_usd: float | None,
        default_completion: int,
        *,
        hold_seconds: float = HOLD_SECONDS,
    ) -> None:
        """Guard ``job_id``'s spending (no limit, and no holds, when ``budget_usd`` is None).

        A hold stops counting ``hold_seconds`` after its call's check, released or not.
        """
        self.db = db
        self.job_id = job_id
        self.budget_usd = budget_usd
        self.default_completion = default_completion
        self.hold_seconds = hold_seconds
        self.hold_id: int | None = None
        """The id of this guard's current hold (its latest call's), or None."""

    def check(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]], what: str
    ) -> float:
        """``what``'s estimated price (a call, an escalation); refused if it overruns.

        Counts the holds of calls in flight, and takes none: ``before_call`` holds.
        Without a budget nothing is estimated (0.0).
        """
        if self.budget_usd is None:
            return 0.0
        estimate = self._estimate(tier, messages, tools, what)
        with self.db.reader() as session:
            paid, held = _committed(session, self.job_id, utcnow(), self.hold_id)
        self._refuse_over(paid, held, estimate, tier, what)
        return estimate

    def before_call(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> None:
        """The check before a live model call: refuse it, or hold its estimate.

        One transaction under the job's row lock releases this guard's previous hold,
        deletes the job's expired ones, checks, and holds. A refused call holds nothing.
        """
        if self.budget_usd is None:
            return
        what = "the next model call"
        estimate = self._estimate(tier, messages, tools, what)  # outside the lock
        with self.db.session() as session:
            session.get_one(Job, self.job_id, with_for_update=True)  # job first, as everywhere
            now = utcnow()
            stale = [BudgetHold.expires_at <= now]
            if self.hold_id is not None:
                stale.append(BudgetHold.id == self.hold_id)
            session.execute(delete(BudgetHold).where(BudgetHold.job_id == self.job_id, or_(*stale)))
            paid, held = _committed(session, self.job_id, now, None)
            hold = None
            if paid + held + estimate <= self.budget_usd:
                hold = BudgetHold(
                    job_id=self.job_id,
                    amount_usd=estimate,
                    expires_at=now + timedelta(seconds=self.hold_seconds),
                )
                session.add(hold)
                session.flush()
        self.hold_id = None if hold is None else hold.id  # committed: the old hold is gone
        self._refuse_over(paid, held, estimate, tier, what)

    def release(self) -> None:
        """Release this guard's hold: its call is paid (journaled) or was never sent.

        Idempotent; nothing is written when the guard holds nothing.
        """
        if self.hold_id is None:
            return
        with self.db.session() as session:
            session.execute(delete(BudgetHold).where(BudgetHold.id == self.hold_id))
        self.hold_id = None

    def release_quietly(self) -> None:
        """``release`` at an attempt's end; if the database is away, the hold expires."""
        try:
            self.release()
        except Exception:
            log.warning("job %s: a budget hold is left to expire", self.job_id)

    def _estimate(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]], what: str
    ) -> float:
        """The call's estimated price; BudgetExceeded when the tier has none."""
        assert self.budget_usd is not None
        completion = expected_completion(self.db, self.job_id, self.default_completion)
        estimate = call_price(tier, prompt_tokens(tier, messages, tools), completion)
        if estimate is None:
            raise BudgetExceeded(
                f"budget of ${self.budget_usd:.4f}: {what} on {describe(tier)} has no known "
                "price; set the tier's price_in and price_out"
            )
        return estimate

    def _refuse_over(
        self, paid: float, held: float, estimate: float, tier: Tier, what: str
    ) -> None:
        """BudgetExceeded when ``paid``, ``held`` and ``estimate`` together overrun."""
        assert self.budget_usd is not None
        if paid + held + estimate <= self.budget_usd:
            return
        in_flight = f", ${held:.4f} held by calls in flight" if held > 0 else ""
        raise BudgetExceeded(
            f"budget of ${self.budget_usd:.4f} reached: spent ${paid:.4f}{in_flight}, and "
            f"{what} on tier {tier.name!r} is estimated at ${estimate:.4f}"
        )


def job_guard(db: Database, job_id: str, budget_usd: float | None, limits: Limits) -> BudgetGuard:
    """The guard of one attempt's (or one check's) calls against its job's budget.

    A hold outlives a worker killed mid-call by at most a turn's longest time.
    """
    return BudgetGuard(
        db,
        job_id,
        budget_usd,
        limits.expected_completion_tokens,
        hold_seconds=limits.turn_timeout + 60,
    )


def estimate_attempt(
    db: Database, job_id: str, budget_usd: float, limits: Limits, tier: Tier, step: Step
) -> float:
    """The price of the first call of an escalation of ``step`` to ``tier``.

    The call is priced as the agent would send it: the step's brief, every earlier
    failure as feedback, the built-in tools. BudgetExceeded when the job's budget, less
    its spend and its calls in flight, cannot pay for it.
    """
    # Imported here: a submission checks its prices without loading the agent's stack.
    from merlin_flow.agents.loop import first_messages
    from merlin_flow.agents.step_tools import step_brief
    from merlin_flow.tools.schemas import TOOL_SCHEMAS

    feedback = feedback_for(AttemptKind.ESCALATE, step.attempts)
    messages = first_messages(step_brief(step), feedback)
    guard = BudgetGuard(db, job_id, budget_usd, limits.expected_completion_tokens)
    return guard.check(tier, messages, TOOL_SCHEMAS, "escalating")


def escalation_over_budget(
    db: Database, session: Session, step: Step, nxt: Decision, config: MerlinConfig
) -> str | None:
    """Why the planned escalation of ``step`` cannot be paid for, or None when it can."""
    budget = session.get_one(Job, step.job_id).budget_usd
    if nxt.action is not Action.ESCALATE or budget is None:
        return None
    tier = config.tiers[nxt.tier_index]
    try:
        estimate_attempt(db, step.job_id, budget, config.limits, tier, step)
    except BudgetExceeded as exc:
        return f"step {step.key} stopped before escalating: {exc}"
    return None
