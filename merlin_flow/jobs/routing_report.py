"""How often the first tier was right: ``merlin costs --routing``.

A finished step started on a tier (the journal's, the rules' or its own, as
``steps.route`` records) and either passed there, passed on a stronger tier after
escalating, or failed on every tier. The report counts those per way of routing and
starting tier, with what the steps spent and what they spent on tiers that did not pass.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from sqlalchemy import select

from merlin_flow.store import Attempt, AttemptStatus, Database, Job, Step, StepStatus
from merlin_flow.store.models import utcnow

UNRECORDED = "unrecorded"
"""How a step was routed when it predates ``steps.route``."""


class RoutingRow(TypedDict):
    """Steps routed one way to one first tier (``by`` and ``tier``), or all of them."""

    by: str
    """``journal``, ``rules``, ``step`` or ``agent`` (they name the tier), ``unrecorded`` or
    ``all``."""
    tier: str
    """The tier the steps started on (``all`` in the total)."""
    steps: int
    right_first: int
    """Passed on the tier they started on."""
    escalated: int
    """Passed on a stronger tier."""
    failed: int
    """Passed on no tier."""
    right_share: float | None
    """``right_first / steps``."""
    cost_usd: float
    wasted_usd: float
    """Spent on tiers that did not pass."""


class RoutingReport(TypedDict):
    """What ``merlin costs --routing --json`` prints."""

    since_hours: float | None
    repo: str | None
    rows: list[RoutingRow]
    total: RoutingRow


def _row(by: str, tier: str) -> RoutingRow:
    return {
        "by": by,
        "tier": tier,
        "steps": 0,
        "right_first": 0,
        "escalated": 0,
        "failed": 0,
        "right_share": None,
        "cost_usd": 0.0,
        "wasted_usd": 0.0,
    }


def routing_report(
    db: Database, since: timedelta | None = None, repo: str | None = None
) -> RoutingReport:
    """The finished steps of jobs created ``since`` ago (all when None), of ``repo``."""
    query = (
        select(Step.id, Step.route, Attempt.tier, Attempt.status, Attempt.cost_usd)
        .join(Job, Job.id == Step.job_id)
        .join(Attempt, Attempt.step_id == Step.id)
        .where(Step.status.in_([StepStatus.COMPLETED, StepStatus.FAILED]))
        .order_by(Step.id, Attempt.number)
    )
    if since is not None:
        query = query.where(Job.created_at >= utcnow() - since)
    if repo is not None:
        query = query.where(Job.repo == repo)
    steps: dict[int, tuple[str, list[tuple[str, bool, float]]]] = {}
    with db.reader() as session:
        for step_id, route, tier, status, cost in session.execute(query):
            by = (route or {}).get("by", UNRECORDED)
            steps.setdefault(step_id, (by, []))[1].append(
                (tier, status == AttemptStatus.PASSED, cost or 0.0)
            )
    rows: dict[tuple[str, str], RoutingRow] = {}
    total = _row("all", "all")
    for by, attempts in steps.values():
        first = attempts[0][0]
        passed_on = next((tier for tier, passed, _ in attempts if passed), None)
        for row in (rows.setdefault((by, first), _row(by, first)), total):
            row["steps"] += 1
            row["right_first"] += passed_on == first
            row["escalated"] += passed_on not in (None, first)
            row["failed"] += passed_on is None
            row["cost_usd"] += sum(cost for _, _, cost in attempts)
            row["wasted_usd"] += sum(cost for tier, _, cost in attempts if tier != passed_on)
    ordered = [rows[key] for key in sorted(rows)]
    for row in [*ordered, total]:
        row["right_share"] = row["right_first"] / row["steps"] if row["steps"] else None
    hours = since.total_seconds() / 3600 if since is not None else None
    return {"since_hours": hours, "repo": repo, "rows": ordered, "total": total}
