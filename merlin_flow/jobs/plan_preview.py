"""What a plan will cost before it runs: how it was made, and a row per step with estimates.

``merlin plan`` and ``merlin approve`` show it as a table, ``merlin github`` as a
Markdown table in the plan comment. Estimates are the planner's tokens per step at the
price of the tier the step starts on; a step without either is ``unknown``, and a total
over some unknown steps is a floor (``≥``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from merlin_flow.config import MerlinConfig
from merlin_flow.planning.route_learning import RouteBook, describe
from merlin_flow.tasklist import TaskList

N = TypeVar("N", int, float)
UNKNOWN = "unknown"


@dataclass(frozen=True)
class PlanRow:
    """One step of the preview."""

    step: str
    step_type: str
    title: str
    depends_on: str
    tokens: str
    cost: str
    """``$0.0012 (local)``: the estimate and the tier the step starts on."""
    route: str = ""
    """Why it starts there and on what evidence (empty without the journal)."""


def how_planned(record: dict[str, Any], config: MerlinConfig) -> tuple[str, bool]:
    """One sentence on how the plan was made, and whether it is the fallback (a warning)."""
    if record["fallback"]:
        problems = "; ".join(problem.rstrip(".") for problem in record["problems"])
        return (
            "FALLBACK: the planner's answer could not be used, so the plan is one step "
            f"carrying the whole request. Problems: {problems}",
            True,
        )
    if record["planned"]:
        cost = record["cost_usd"]
        paid = "unknown cost" if cost is None else f"${cost:.4f}"
        return (
            f"planned by tier {config.planning_tier().name} in {record['seconds']:.1f} s "
            f"({record['prompt_tokens']} tokens in, {record['completion_tokens']} out, "
            f"{paid}); {record['reason']}, {record['complexity']}",
            False,
        )
    return f"one step, not sent to the planner: a single action ({record['reason']})", False


def plan_rows(
    record: dict[str, Any], config: MerlinConfig, tasklist: TaskList, book: RouteBook | None = None
) -> list[PlanRow]:
    """A row per step of ``tasklist``, then the total (its ``step`` is ``total``).

    ``book``: the repository's finished steps, which route the steps as submission will
    (the rules alone when None, and no route is described).
    """
    by_id = {step["id"]: step for step in record["steps"]}
    tokens_of: list[int | None] = []
    costs: list[float | None] = []
    rows = []
    for task in tasklist.steps:
        planned = by_id.get(task.id)
        tokens = planned["estimated_tokens"] if planned else None
        route = (book or RouteBook([])).route(task, config)
        tier = config.tiers[route.tier]
        cost = None if tokens is None or tier.price_in is None else tokens * tier.price_in / 1e6
        tokens_of.append(tokens)
        costs.append(cost)
        rows.append(
            PlanRow(
                task.id,
                task.step_type.value,
                planned["title"] if planned else task.description.splitlines()[0],
                ", ".join(task.depends_on or []) or "-",
                estimate(tokens, str),
                estimate(cost, "${:.4f}".format) + f" ({tier.name})",
                describe(route.to_record(config)) if book is not None else "",
            )
        )
    totals = PlanRow(
        "total", "", "", "", total(tokens_of, str), total(costs, "${:.4f}".format)
    )  # fmt: skip
    return [*rows, totals]


def estimate(value: N | None, show: Callable[[N], str]) -> str:
    """One step's estimate: ``unknown`` when there is none."""
    return UNKNOWN if value is None else show(value)


def total(values: Sequence[N | None], show: Callable[[N], str]) -> str:
    """The sum of the estimates: ``unknown`` when none is known, ``≥N`` when some are not."""
    known = [value for value in values if value is not None]
    if not known and values:
        return UNKNOWN
    floor = "≥" if len(known) < len(values) else ""
    return floor + show(sum(known))
