"""Cost reports from the LLM journal: what ``merlin costs`` prints.

Every figure is summed from ``llm_calls``: a call counts once as made; ``replayed``
calls (answered from the journal after a crash, or by ``merlin replay``), ``cached``
ones (answered by the response cache) and ``failed`` ones (an error instead of an
answer) are counted apart, and only paid calls carry tokens and cost.

A paid call whose price is unknown (``llm.call_price``) has no cost. Every row counts
them as ``unpriced_calls`` and gives ``known_cost_usd``, the sum of the known costs; its
``cost_usd`` is that sum when every call was priced, and None (unknown) otherwise.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, TypedDict

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.failures import AttemptKind
from merlin_flow.store import Attempt, Database, Event, Job, JobStatus, LlmCall, Step, utcnow
from merlin_flow.store.events import EventKind, NextAttemptData, data_of

DURATION = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")
UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class CostFields(TypedDict):
    """The cost of anything that made model calls, as every view shows it."""

    unpriced_calls: int
    """Calls whose price is unknown."""
    known_cost_usd: float
    """What the priced calls cost."""
    cost_usd: float | None
    """The whole cost; None when any call is unpriced."""


class CallCounts(CostFields):
    """Calls, tokens and cost of a group of calls (a job, a tier, an attempt)."""

    calls: int
    replayed_calls: int
    cached_calls: int
    failed_calls: int
    prompt_tokens: int
    completion_tokens: int


class TierCosts(CallCounts):
    """The calls of one tier."""

    tier: str


class AttemptCosts(CallCounts):
    """The calls of one attempt."""

    number: int
    kind: AttemptKind
    tier: str


class StepCosts(CostFields):
    """The calls of one step, attempt by attempt."""

    id: str
    calls: int
    attempts: list[AttemptCosts]


class Escalation(TypedDict):
    """One escalation, from the job's events."""

    job_id: str
    step: str | None
    from_tier: str | None
    to_tier: str | None
    reason: str | None


class JobCosts(TypedDict):
    """What ``merlin costs JOB --json`` prints."""

    job_id: str
    status: JobStatus
    budget_usd: float | None
    total: CallCounts
    tiers: list[TierCosts]
    steps: list[StepCosts]
    escalations: list[Escalation]


class CostsSince(TypedDict):
    """What ``merlin costs --since --json`` prints."""

    since: str
    jobs: int
    total: CallCounts
    tiers: list[TierCosts]
    escalations: int


NO_CALLS: CallCounts = {
    "calls": 0,
    "replayed_calls": 0,
    "cached_calls": 0,
    "failed_calls": 0,
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "unpriced_calls": 0,
    "known_cost_usd": 0.0,
    "cost_usd": 0.0,
}


def parse_since(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d`` or ``2w`` as a timedelta; InputError otherwise."""
    match = DURATION.match(text)
    if match is None:
        raise InputError(f"--since {text!r}: use a number and m, h, d or w, like 7d")
    return timedelta(seconds=int(match.group(1)) * UNIT_SECONDS[match.group(2)])


PAID = (LlmCall.error.is_(None), LlmCall.replayed.is_(False), LlmCall.cached.is_(False))
"""A call that was answered, and answered live: the only kind with tokens and a cost."""
UNPRICED = (*PAID, LlmCall.cost_usd.is_(None))
"""A paid call whose price is unknown."""


def _sums(*group_by: Any) -> Any:
    paid = and_(*PAID)
    return select(
        *group_by,
        func.count(LlmCall.id).label("calls"),
        func.sum(case((LlmCall.replayed.is_(True), 1), else_=0)).label("replayed_calls"),
        func.sum(case((LlmCall.cached.is_(True), 1), else_=0)).label("cached_calls"),
        func.sum(case((LlmCall.error.is_not(None), 1), else_=0)).label("failed_calls"),
        func.sum(case((paid, LlmCall.prompt_tokens), else_=0)).label("prompt_tokens"),
        func.sum(case((paid, LlmCall.completion_tokens), else_=0)).label("completion_tokens"),
        func.sum(case((paid & LlmCall.cost_usd.is_(None), 1), else_=0)).label("unpriced_calls"),
        func.coalesce(func.sum(LlmCall.cost_usd), 0.0).label("cost_usd"),
    )


def _row(row: Any) -> CallCounts:
    return {
        "calls": int(row.calls or 0),
        "replayed_calls": int(row.replayed_calls or 0),
        "cached_calls": int(row.cached_calls or 0),
        "failed_calls": int(row.failed_calls or 0),
        "prompt_tokens": int(row.prompt_tokens or 0),
        "completion_tokens": int(row.completion_tokens or 0),
        **cost_fields(float(row.cost_usd or 0.0), int(row.unpriced_calls or 0)),
    }


def cost_fields(known: float, unpriced: int) -> CostFields:
    """``cost_usd`` (None when any call is unpriced), ``known_cost_usd``, ``unpriced_calls``."""
    known = round(known, 6)
    return {
        "unpriced_calls": unpriced,
        "known_cost_usd": known,
        "cost_usd": None if unpriced else known,
    }


def _sum_costs(rows: list[AttemptCosts]) -> CostFields:
    known = sum(row["known_cost_usd"] for row in rows)
    return cost_fields(known, sum(row["unpriced_calls"] for row in rows))


def _escalations(session: Session, job_ids: Any) -> list[Escalation]:
    escalated = Event.job_id.in_(job_ids), Event.kind == EventKind.ESCALATED
    events = session.scalars(select(Event).where(*escalated).order_by(Event.id)).all()
    found: list[Escalation] = []
    for event in events:
        data = data_of(event, NextAttemptData)
        found.append(
            {
                "job_id": event.job_id,
                "step": event.step_key,
                "from_tier": data.get("from_tier"),
                "to_tier": data.get("to_tier"),
                "reason": data.get("reason"),
            }
        )
    return found


def job_costs(db: Database, job_id: str) -> JobCosts:
    """A job's calls, tokens and cost: total, per tier, per step and per attempt."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFoundError(f"no job with id {job_id!r}")
        where = LlmCall.job_id == job_id
        total = session.execute(_sums().where(where)).one()
        tiers = session.execute(_sums(LlmCall.tier).where(where).group_by(LlmCall.tier)).all()
        per_attempt = {
            row.attempt_id: _row(row)
            for row in session.execute(
                _sums(LlmCall.attempt_id).where(where).group_by(LlmCall.attempt_id)
            ).all()
        }
        steps: list[StepCosts] = []
        for step in session.scalars(
            select(Step).where(Step.job_id == job_id).order_by(Step.position)
        ).all():
            attempts: list[AttemptCosts] = [
                {
                    "number": attempt.number,
                    "kind": AttemptKind(attempt.kind),
                    "tier": attempt.tier,
                    **per_attempt.get(attempt.id, NO_CALLS),
                }
                for attempt in session.scalars(
                    select(Attempt).where(Attempt.step_id == step.id).order_by(Attempt.number)
                ).all()
            ]
            steps.append(
                {
                    "id": step.key,
                    **_sum_costs(attempts),
                    "calls": sum(a["calls"] for a in attempts),
                    "attempts": attempts,
                }
            )
        return {
            "job_id": job_id,
            "status": JobStatus(job.status),
            "budget_usd": job.budget_usd,
            "total": _row(total),
            "tiers": [{"tier": row.tier, **_row(row)} for row in tiers],
            "steps": steps,
            "escalations": _escalations(session, [job_id]),
        }


def costs_since(db: Database, since: timedelta) -> CostsSince:
    """Totals across the jobs created in the last ``since``, and per tier."""
    start = utcnow() - since
    with db.reader() as session:
        job_ids = select(Job.id).where(Job.created_at >= start)
        jobs = session.scalar(select(func.count()).select_from(Job).where(Job.created_at >= start))
        where = LlmCall.job_id.in_(job_ids)
        total = session.execute(_sums().where(where)).one()
        tiers = session.execute(_sums(LlmCall.tier).where(where).group_by(LlmCall.tier)).all()
        escalations = _escalations(session, job_ids)
    return {
        "since": start.isoformat(timespec="seconds") + "Z",
        "jobs": int(jobs or 0),
        "total": _row(total),
        "tiers": [{"tier": row.tier, **_row(row)} for row in tiers],
        "escalations": len(escalations),
    }


class DayCosts(CallCounts):
    """The calls of one tier on one day."""

    day: str
    """The UTC day the calls were made, ``YYYY-MM-DD``."""
    tier: str


def costs_per_day(db: Database, since: timedelta) -> list[DayCosts]:
    """The calls ``costs_since`` counts, per UTC day they were made and per tier.

    The same calls (those of the jobs created in the last ``since``), grouped in SQL by
    the day of each call's ``created_at``: the rows of a tier add up to its row in
    ``costs_since``. Oldest day first, then by tier; a day without calls has no row.
    """
    start = utcnow() - since
    day = func.date(LlmCall.created_at)  # SQLite: a 'YYYY-MM-DD' text; Postgres: a date
    with db.reader() as session:
        job_ids = select(Job.id).where(Job.created_at >= start)
        rows = session.execute(
            _sums(day.label("day"), LlmCall.tier)
            .where(LlmCall.job_id.in_(job_ids))
            .group_by(day, LlmCall.tier)
            .order_by(day, LlmCall.tier)
        ).all()
    return [{"day": str(row.day), "tier": row.tier, **_row(row)} for row in rows]
