"""The plan preview's rows and sentence, as the CLI table and the GitHub comment show them."""

from __future__ import annotations

from typing import Any

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.jobs.plan_preview import PlanRow, how_planned, plan_rows
from merlin_flow.tasklist import TaskList

CONFIG = MerlinConfig(
    tiers=[
        Tier(name="local", model="openai/x", price_in=2.0),
        Tier(name="premium", model="openai/y", price_in=10.0),
    ]
)


def record(**fields: Any) -> dict[str, Any]:
    return {"kind": "task", "fallback": False, "planned": False, "reason": "a test",
            "problems": [], "steps": [], **fields}  # fmt: skip


def test_each_step_is_priced_on_the_tier_it_starts_on() -> None:
    tasklist = TaskList.model_validate({"title": "t", "steps": [
        {"id": "a", "step_type": "Feature", "description": "first line\nmore"},
        {"id": "b", "step_type": "Test", "description": "b", "tier": "premium",
         "depends_on": ["a"]},
    ]})  # fmt: skip
    planned = record(steps=[{"id": "b", "title": "Test it", "estimated_tokens": 1000}])
    assert plan_rows(planned, CONFIG, tasklist) == [
        PlanRow("a", "Feature", "first line", "-", "unknown", "unknown (local)"),
        PlanRow("b", "Test", "Test it", "a", "1000", "$0.0100 (premium)"),
        PlanRow("total", "", "", "", "≥1000", "≥$0.0100"),
    ]


def test_how_the_plan_was_made() -> None:
    assert how_planned(record(reason="one command"), CONFIG) == (
        "one step, not sent to the planner: a single action (one command)",
        False,
    )
    sentence, fallback = how_planned(record(fallback=True, problems=["no steps."]), CONFIG)
    assert fallback
    assert sentence.endswith("Problems: no steps")
    made = record(planned=True, cost_usd=None, seconds=2.04, prompt_tokens=900,
                  completion_tokens=120, complexity="medium")  # fmt: skip
    assert how_planned(made, CONFIG)[0] == (
        "planned by tier local in 2.0 s (900 tokens in, 120 out, unknown cost); a test, medium"
    )


def test_with_the_journal_each_row_says_where_the_step_starts_and_why() -> None:
    from merlin_flow.planning.route_learning import PastStep, RouteBook, kind_of
    from merlin_flow.tasklist import StepType

    description = "add a cache to every handler across the service"
    learned = PastStep(kind_of(StepType.FEATURE, description), {"local": True}, {"local": 0.01})
    tasklist = TaskList.model_validate(
        {"title": "t", "steps": [{"id": "a", "step_type": "Feature", "description": description}]}
    )
    config = CONFIG.model_copy(update={"routing": CONFIG.routing.model_copy(
        update={"medium": "premium"})})  # fmt: skip
    by_rules, _ = plan_rows(record(), config, tasklist, RouteBook([]))
    assert by_rules.cost == "unknown (premium)"
    assert by_rules.route.startswith("premium: by the rules (0 similar steps")
    by_journal, _ = plan_rows(record(), config, tasklist, RouteBook([learned] * 3))
    assert by_journal.cost == "unknown (local)"
    assert by_journal.route == (
        "local: from the journal (3 similar steps in the journal: local passed 3 of 3, "
        "premium passed 1.5 of 1.5); the rules say premium"
    )
    assert plan_rows(record(), config, tasklist)[0].route == ""  # no journal, no claim
