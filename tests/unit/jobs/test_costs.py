"""Cost reports of a job with retries and an escalation: per attempt, tier and window."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.config import Limits
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.costs import costs_per_day, costs_since, job_costs, parse_since
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, LlmCall, utcnow
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


# Costs per day: the calls of `costs --since`, by the UTC day each was made.


def _job(job_id: str, created_at: datetime) -> Job:
    return Job(id=job_id, title="t", repo="/repo", status=JobStatus.COMPLETED,
               branch=f"merlin/{job_id}", base_commit="0" * 40, head_commit="0" * 40,
               tasklist={"title": "t", "steps": []}, config={}, created_at=created_at)  # fmt: skip


def journal_on_three_days(db: Database) -> dict[str, str]:
    """Calls of two tiers on three days, of two jobs created 3 days and 1 hour ago, and
    of a job created 20 days ago (one of its calls made today).

    The days (``YYYY-MM-DD``, UTC) by name: ``three``, ``two`` and ``hour`` (days ago).
    """
    now = utcnow()
    three, two, hour = now - timedelta(days=3), now - timedelta(days=2), now - timedelta(hours=1)
    old = now - timedelta(days=20)
    calls: list[tuple[str, str, float | None, datetime, dict[str, Any]]] = [
        ("recent", "local", 0.01, three, {}),
        ("recent", "premium", 0.5, three, {}),
        ("recent", "premium", 0.2, two, {}),  # a job's calls fall on the days they are made
        ("recent", "local", None, two, {"cached": True}),
        ("today", "premium", 0.25, hour, {}),
        ("today", "local", None, hour, {}),  # paid, of unknown price
        ("today", "local", None, hour, {"error": "RateLimitError"}),
        ("old", "premium", 9.0, old, {}),
        ("old", "premium", 9.0, hour, {}),  # its job was created before the period
    ]
    with db.session() as session:
        session.add_all([_job("recent", three), _job("today", hour), _job("old", old)])
        for seq, (job_id, tier, cost, made_at, flags) in enumerate(calls):
            session.add(
                LlmCall(job_id=job_id, seq=seq, tier=tier, model="m", request_hash="h",
                        prompt_tokens=10, completion_tokens=5, cost_usd=cost, created_at=made_at,
                        **flags)
            )  # fmt: skip
    return {name: when.date().isoformat() for name, when in [("three", three), ("two", two),
                                                              ("hour", hour)]}  # fmt: skip


def test_costs_per_day_split_the_calls_of_costs_since_by_day_and_tier(store: Database) -> None:
    days = journal_on_three_days(store)
    rows = costs_per_day(store, parse_since("14d"))
    assert [(r["day"], r["tier"], r["calls"], r["known_cost_usd"]) for r in rows] == [
        (days["three"], "local", 1, 0.01),
        (days["three"], "premium", 1, 0.5),
        (days["two"], "local", 1, 0.0),
        (days["two"], "premium", 1, 0.2),
        (days["hour"], "local", 2, 0.0),
        (days["hour"], "premium", 1, 0.25),
    ]
    cached, unpriced = rows[2], rows[4]
    assert (cached["cached_calls"], cached["prompt_tokens"], cached["cost_usd"]) == (1, 0, 0.0)
    assert (unpriced["failed_calls"], unpriced["unpriced_calls"]) == (1, 1)
    assert (unpriced["prompt_tokens"], unpriced["cost_usd"]) == (10, None)
    report = costs_since(store, parse_since("14d"))
    assert report["jobs"] == 2
    for tier in report["tiers"]:
        mine = [row for row in rows if row["tier"] == tier["tier"]]
        for key in ("calls", "cached_calls", "failed_calls", "unpriced_calls", "prompt_tokens"):
            assert sum(row[key] for row in mine) == tier[key], (tier["tier"], key)
        assert sum(row["known_cost_usd"] for row in mine) == pytest.approx(tier["known_cost_usd"])
    recent = costs_per_day(store, parse_since("1d"))  # the job made an hour ago only
    assert [(r["day"], r["tier"], r["calls"]) for r in recent] == [
        (days["hour"], "local", 2),
        (days["hour"], "premium", 1),
    ]
