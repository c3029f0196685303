"""Prices: known, unknown ("unknown" is not $0.0000), and budgets that refuse unpriced tiers."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from merlin_flow.cli.cost_tables import job_costs_tables, money
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.budget import BudgetGuard
from merlin_flow.errors import BudgetExceeded, InputError
from merlin_flow.jobs.costs import costs_since, job_costs
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.models.llm import call_price, is_priced
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, LlmCall, Step
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git

ONE_STEP = parse_tasklist(
    {"title": "t", "steps": [{"id": "s0", "step_type": "Debug", "description": "42"}]}
)
LOCAL = Tier(name="local", model="openai/smollm2", api_base="http://127.0.0.1:9/v1")
"""At its own endpoint, with no price: whatever its name, litellm's map does not apply."""


def test_which_tiers_have_a_price(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text("rules: []\n")
    assert call_price(Tier(name="s", model=f"scripted/{script}"), 1000, 1000) == 0.0
    assert call_price(LOCAL, 1000, 1000) is None
    # The same model name at OpenAI's own endpoint is in litellm's price map.
    assert call_price(Tier(name="f", model="openai/gpt-4o-mini"), 1_000_000, 0) == pytest.approx(
        0.15
    )
    assert not is_priced(Tier(name="f", model="openai/gpt-4o-mini", api_base="http://x:1/v1"))
    own = LOCAL.model_copy(update={"price_in": 0.0, "price_out": 0.0})
    assert call_price(own, 1000, 1000) == 0.0


def test_a_budget_refuses_an_unpriced_tier_and_writes_nothing(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    config = MerlinConfig(tiers=[LOCAL])
    with pytest.raises(InputError) as caught:
        create_job(db, settings, ONE_STEP, py_repo, config, budget_usd=1.0)
    message = str(caught.value)
    assert "tier 'local' (openai/smollm2 at http://127.0.0.1:9/v1)" in message
    assert "price_in and price_out" in message
    with db.reader() as session:
        assert session.query(Job).count() == 0
    assert git(py_repo, "branch", "--list", "merlin/*") == ""
    # The configuration's own budget counts too; without a budget the job is accepted.
    with pytest.raises(InputError, match="cannot limit tiers whose price is unknown"):
        create_job(db, settings, ONE_STEP, py_repo, config.model_copy(update={"budget_usd": 2.0}))
    assert create_job(db, settings, ONE_STEP, py_repo, config)


def test_a_budget_ignores_an_unpriced_tier_no_step_can_use(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    script = tmp_path / "s.yaml"
    script.write_text("rules: []\n")
    scripted = Tier(name="scripted", model=f"scripted/{script}")
    verify_only = Tier(**{**LOCAL.model_dump(), "step_types": ["Verify"]})
    config = MerlinConfig(tiers=[scripted, verify_only])
    assert create_job(db, settings, ONE_STEP, py_repo, config, budget_usd=1.0)


def test_the_guard_never_lets_an_unpriced_call_pass_as_free(db: Database) -> None:
    guard = BudgetGuard(db, "job", 5.0, 100)
    with pytest.raises(BudgetExceeded, match="has no known price"):
        guard.before_call(LOCAL, [{"role": "user", "content": "hi"}], [])


def _journal(db: Database, settings: Settings, py_repo: Path, costs: list[float | None]) -> str:
    job_id = create_job(db, settings, ONE_STEP, py_repo, MerlinConfig(tiers=[LOCAL]))
    with db.session() as session:
        step = session.query(Step).filter_by(job_id=job_id).one()
        from merlin_flow.store import Attempt

        attempt = Attempt(
            step_id=step.id,
            number=1,
            kind="execute",
            tier="local",
            model="m",
            status="failed",
            start_commit="0" * 40,
        )
        session.add(attempt)
        session.flush()
        for seq, cost in enumerate(costs):
            session.add(
                LlmCall(
                    job_id=job_id, step_id=step.id, attempt_id=attempt.id, seq=seq, tier="local",
                    model="openai/smollm2", request_hash="h", prompt_tokens=10,
                    completion_tokens=5, cost_usd=cost,
                )
            )  # fmt: skip
        attempt.cost_usd = sum(cost or 0.0 for cost in costs)
    return job_id


def test_unpriced_calls_show_as_unknown_everywhere(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    job_id = _journal(db, settings, py_repo, [None, None])
    view = job_view(db, job_id)
    assert (view["cost_usd"], view["unpriced_calls"]) == (None, 2)
    assert view["steps"][0]["attempts"][0]["cost_usd"] is None
    report = job_costs(db, job_id)
    assert report["total"]["cost_usd"] is None
    assert report["tiers"][0]["unpriced_calls"] == 2
    assert report["steps"][0]["cost_usd"] is None
    from datetime import timedelta

    assert costs_since(db, timedelta(days=1))["total"]["cost_usd"] is None
    console = Console(record=True, width=200)
    for table in job_costs_tables(report):
        console.print(table)
    text = console.export_text()
    assert "total unknown" in text
    assert "$0.0000" not in text


def test_a_mix_of_priced_and_unpriced_calls_gives_a_lower_bound(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    job_id = _journal(db, settings, py_repo, [0.25, None])
    total = job_costs(db, job_id)["total"]
    assert (total["cost_usd"], total["known_cost_usd"], total["unpriced_calls"]) == (None, 0.25, 1)
    assert money(total) == "≥$0.2500 (+1 unpriced call)"
    priced = job_costs(db, _journal(db, settings, py_repo, [0.25, 0.5]))["total"]
    assert (priced["cost_usd"], priced["unpriced_calls"]) == (0.75, 0)
    assert money(priced) == "$0.7500"
