"""Budgets: the first call a job cannot pay is refused; a budget that covers it lets it finish."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from merlin_flow.attempt import execute_step
from merlin_flow.config import MerlinConfig
from merlin_flow.jobs import job_view
from merlin_flow.lifecycle import Outcome
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.submission import create_job
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.verdict import verify_step
from tests.unit.scripted_jobs import ONE_STEP, priced_tier


def test_budget_refuses_the_first_call_it_cannot_pay(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.store import LlmCall

    config = MerlinConfig(tiers=[priced_tier(tmp_path, price_out=1.0)])
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config, budget_usd=1e-6)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.STOP
    view = job_view(db, job_id)
    assert view["status"] == "budget_exceeded"
    assert view["finished_at"] is not None
    assert "budget of $0.0000 reached: spent $0.0000" in view["error"]
    assert view["steps"][0]["attempts"][0]["status"] == "error"
    with db.reader() as session:
        assert session.scalars(select(LlmCall)).all() == []  # nothing was sent


def test_a_budget_that_covers_the_job_lets_it_finish(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config = MerlinConfig(tiers=[priced_tier(tmp_path, price_out=1.0)], budget_usd=1.0)
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:2") is Outcome.CONTINUE
    view = job_view(db, job_id)
    assert view["budget_usd"] == 1.0  # from the configuration
    assert 0 < view["cost_usd"] < 1.0
