"""Cost reports of a job with retries and an escalation: per attempt, tier and window."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from merlin_flow.config import Limits
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.costs import costs_since, job_costs, parse_since
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from tests.unit.scripted_jobs import ONE_STEP, rate_limited_then_premium


def test_cost_report_of_a_job_with_retries_and_an_escalation(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config = rate_limited_then_premium(
        tmp_path, Limits(max_retry_attempts=1, retry_base_delay=0.0, fix_attempts=0)
    )
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config, budget_usd=5.0)
    for n in range(2):
        execute_step(db, settings, job_id, "s0", f"w:{n}a")
        verify_step(db, settings, job_id, "s0", f"w:{n}b")
    report = job_costs(db, job_id)
    (step,) = report["steps"]
    local_attempt, premium_attempt = step["attempts"]
    assert (local_attempt["kind"], local_attempt["calls"], local_attempt["failed_calls"]) == (
        "execute",
        2,
        2,
    )
    assert local_attempt["cost_usd"] == 0
    assert (premium_attempt["kind"], premium_attempt["calls"]) == ("escalate", 2)
    assert premium_attempt["cost_usd"] > 0
    assert report["total"]["cost_usd"] == pytest.approx(premium_attempt["cost_usd"])
    assert report["total"]["cost_usd"] == pytest.approx(job_view(db, job_id)["cost_usd"])
    assert {t["tier"]: t["calls"] for t in report["tiers"]} == {"local": 2, "premium": 2}
    assert [(e["from_tier"], e["to_tier"]) for e in report["escalations"]] == [("local", "premium")]
    assert "RateLimitError" in report["escalations"][0]["reason"]
    assert report["budget_usd"] == 5.0
    recent = costs_since(db, parse_since("1d"))
    assert recent["jobs"] == 1
    assert recent["total"] == report["total"]
    assert recent["escalations"] == 1
    assert parse_since("2w") == timedelta(days=14)
    with pytest.raises(Exception, match="use a number and m, h, d or w"):
        parse_since("soon")
