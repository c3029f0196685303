"""Job budgets: the next call's cost is estimated, and refused if it would overrun.

A job's budget (``--budget`` or ``budget_usd`` in merlin.toml) is checked before every
live model call and before every escalation. The estimate prices the prompt that is
about to be sent (its tokens counted as the provider will count them) plus the expected
completion (the mean completion of the job's earlier calls, or
``limits.expected_completion_tokens`` before the first). A call is refused when the
job's spend so far plus that estimate exceeds the budget, so a job never goes over its
budget by more than one call's estimation error.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.endpoints import describe
from merlin_flow.errors import BudgetExceeded, InputError
from merlin_flow.llm import call_price, is_priced, litellm_module
from merlin_flow.store import Database, LlmCall
from merlin_flow.tasklist import TaskList
from merlin_flow.tokens import conversation_text, count_tokens


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


class BudgetGuard:
    """Raises BudgetExceeded before a call the job's budget cannot pay for."""

    def __init__(
        self, db: Database, job_id: str, budget_usd: float | None, default_completion: int
    ) -> None:
        """Guard ``job_id``'s spending (no limit when ``budget_usd`` is None)."""
        self.db = db
        self.job_id = job_id
        self.budget_usd = budget_usd
        self.default_completion = default_completion

    def check(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]], what: str
    ) -> None:
        """Refuse ``what`` (a call, an escalation) if its estimate overruns the budget."""
        if self.budget_usd is None:
            return
        completion = expected_completion(self.db, self.job_id, self.default_completion)
        estimate = call_price(tier, prompt_tokens(tier, messages, tools), completion)
        if estimate is None:
            raise BudgetExceeded(
                f"budget of ${self.budget_usd:.4f}: {what} on {describe(tier)} has no known "
                "price; set the tier's price_in and price_out"
            )
        paid = spent(self.db, self.job_id)
        if paid + estimate > self.budget_usd:
            raise BudgetExceeded(
                f"budget of ${self.budget_usd:.4f} reached: spent ${paid:.4f}, and {what} on "
                f"tier {tier.name!r} is estimated at ${estimate:.4f}"
            )

    def before_call(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> None:
        """The check before a live model call."""
        self.check(tier, messages, tools, "the next model call")
