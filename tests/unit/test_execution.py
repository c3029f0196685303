"""The step, verify and finalize work driven directly (no Celery), on real git and SQLite."""

from __future__ import annotations

import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from merlin_flow.attempt import execute_step
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.jobs import create_job, job_view
from merlin_flow.leases import Heartbeat, claim
from merlin_flow.lifecycle import Outcome, fail_job, fail_job_in_session, finalize_job
from merlin_flow.recovery import sweep
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, Step
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.verdict import verify_step
from tests.conftest import git, make_repo

SCRIPT = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - reply: {content: done}
"""


ONE_STEP = {"title": "t", "steps": [{"id": "s0", "step_type": "Debug", "description": "42"}]}


def _priced_tier(tmp_path: Path, price_out: float) -> Tier:
    """A tier "local" answering with SCRIPT at $1 per M input tokens and ``price_out``."""
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    return Tier(name="local", model=f"scripted/{script}", price_in=1.0, price_out=price_out)


def _job(db: Database, settings: Settings, repo: Path, tmp_path: Path, steps: int = 1) -> str:
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
    tasklist = parse_tasklist(
        {
            "title": "t",
            "steps": [
                {"id": f"s{i}", "step_type": "Debug", "description": "answer 42"}
                for i in range(steps)
            ],
        }
    )
    return create_job(db, settings, tasklist, repo, config)


def test_step_then_verify_advances_the_branch(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    # A duplicate delivery of the same step message finds the phase moved on.
    assert execute_step(db, settings, job_id, "s0", "w:2") is Outcome.STOP
    assert verify_step(db, settings, job_id, "s0", "w:3") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:4") is Outcome.STOP
    assert finalize_job(db, settings, job_id) == "completed"
    assert "return 42" in git(py_repo, "show", f"merlin/{job_id}:app.py")
    assert not (settings.worktrees_dir / job_id).exists()
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert "| s0 | Debug | Completed | execute@local: 0 |" in summary


def test_a_moved_job_branch_fails_the_job_instead_of_being_overwritten(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    (py_repo / "other.txt").write_text("someone else's work\n")
    git(py_repo, "add", "other.txt")
    git(py_repo, "commit", "-qm", "other")
    git(py_repo, "branch", "-f", f"merlin/{job_id}", "main")
    moved_to = git(py_repo, "rev-parse", f"merlin/{job_id}")
    assert verify_step(db, settings, job_id, "s0", "w:2") is Outcome.STOP
    view = job_view(db, job_id)
    assert view["status"] == "failed"
    assert "was moved by someone else" in view["error"]
    assert view["finished_at"] is not None
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == moved_to


def test_fail_job_only_from_the_lease_holder(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, "attempt", "owner", 30)
    assert not fail_job(db, settings, job_id, "s0", "zombie", "boom")
    assert job_view(db, job_id)["status"] == "pending"
    assert fail_job(db, settings, job_id, "s0", "owner", "boom")
    assert job_view(db, job_id)["status"] == "failed"


def test_sweep_closes_a_failed_job_that_was_never_finalized(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path, steps=2)
    with db.session() as session:  # the worker died between failing the job and closing it
        fail_job_in_session(session, job_id, None, "died")
    assert job_view(db, job_id)["finished_at"] is None
    assert sweep(db, settings, lambda _: None) == []
    view = job_view(db, job_id)
    assert view["finished_at"] is not None
    assert [s["status"] for s in view["steps"]] == ["Skipped", "Skipped"]


def test_one_broken_job_does_not_stop_the_sweep(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    gone = make_repo(tmp_path / "gone", {"pyproject.toml": "", "app.py": "x = 1\n"})
    broken = _job(db, settings, gone, tmp_path)
    with db.session() as session:
        fail_job_in_session(session, broken, None, "died")
    shutil.rmtree(gone)  # finalizing it now fails: its repository is gone
    healthy = _job(db, settings, py_repo, tmp_path)
    with db.session() as session:
        session.execute(
            update(Step).where(Step.job_id == healthy).values(lease_expires_at=datetime(2000, 1, 1))
        )
    enqueued: list[str] = []
    assert sweep(db, settings, enqueued.append) == [healthy]
    assert enqueued == [healthy]


class _BrokenDatabase:
    def session(self) -> Any:
        raise RuntimeError("database unreachable")


def test_heartbeat_counts_a_lease_lost_when_it_cannot_renew() -> None:
    with Heartbeat(_BrokenDatabase(), 1, "me", 0.3) as heartbeat:  # type: ignore[arg-type]
        assert not heartbeat.lost
        time.sleep(0.5)
        assert heartbeat.lost


def test_heartbeat_sees_a_lease_taken_over(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, "attempt", "me", 30)
    with Heartbeat(db, step_id, "me", 0.3) as heartbeat:
        with db.session() as session:
            session.execute(update(Step).where(Step.id == step_id).values(lease_owner="thief"))
        time.sleep(0.25)
        assert heartbeat.lost


def _rate_limited_then_premium(tmp_path: Path, limits: Any) -> MerlinConfig:
    """A local tier that always answers RateLimitError, and a premium tier that works."""
    local = tmp_path / "local.yaml"
    local.write_text("rules:\n  - reply: {error: RateLimitError}\n")
    premium = tmp_path / "premium.yaml"
    premium.write_text(SCRIPT)
    return MerlinConfig(
        tiers=[
            Tier(name="local", model=f"scripted/{local}"),
            Tier(name="premium", model=f"scripted/{premium}", price_in=3.0, price_out=15.0),
        ],
        limits=limits,
    )


def test_rate_limited_tier_retries_then_escalates(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """Transient errors: same-tier retries with backoff, then a capability failure."""
    from merlin_flow.config import Limits
    from merlin_flow.store import LlmCall

    config = _rate_limited_then_premium(
        tmp_path, Limits(max_retry_attempts=2, retry_base_delay=0.01, fix_attempts=1)
    )
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    outcomes = []
    for n in range(3):
        outcomes.append(execute_step(db, settings, job_id, "s0", f"w:{n}a"))
        outcomes.append(verify_step(db, settings, job_id, "s0", f"w:{n}b"))
    assert outcomes == [Outcome.CONTINUE, Outcome.RETRY] * 2 + [Outcome.CONTINUE] * 2
    view = job_view(db, job_id)
    attempts = view["steps"][0]["attempts"]
    assert [(a["kind"], a["tier"], a["status"]) for a in attempts] == [
        ("execute", "local", "error"),
        ("fix", "local", "error"),
        ("escalate", "premium", "passed"),
    ]
    assert "after 2 retries" in attempts[0]["error"]
    with db.reader() as session:
        errors = session.scalars(
            select(LlmCall.error).where(LlmCall.job_id == job_id, LlmCall.tier == "local")
        ).all()
    assert len(errors) == 6  # 1 call + 2 retries, in each of the two local attempts
    assert all(error is not None and error.startswith("RateLimitError") for error in errors)


def test_a_resumed_attempt_replays_paid_calls_instead_of_paying_again(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.agent import first_messages
    from merlin_flow.attempt import _begin_attempt
    from merlin_flow.journal import CallContext, record_call
    from merlin_flow.lifecycle import HeldStep
    from merlin_flow.llm import complete
    from merlin_flow.store import Attempt, LlmCall
    from merlin_flow.tools import TOOL_SCHEMAS

    tier = _priced_tier(tmp_path, price_out=2.0)
    config = MerlinConfig(tiers=[tier])
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    # Run 1: the worker claims the step, pays for turn 0, and dies.
    assert claim(db, step_id, "attempt", "dead", 30)
    plan, _repo, brief = _begin_attempt(
        HeldStep(db, settings, job_id, "s0", step_id, "dead", config)
    )
    first = complete(tier, first_messages(brief, None), TOOL_SCHEMAS)
    record_call(db, CallContext(job_id, step_id, plan.attempt_id, 1, tier), 0, 0, first, None)
    with db.session() as session:
        session.execute(
            update(Step).where(Step.id == step_id).values(lease_expires_at=datetime(2000, 1, 1))
        )
    # Run 2: a new worker takes over the same attempt.
    assert execute_step(db, settings, job_id, "s0", "alive") is Outcome.CONTINUE
    with db.reader() as session:
        calls = session.execute(
            select(LlmCall.run, LlmCall.turn, LlmCall.replayed, LlmCall.cost_usd).order_by(
                LlmCall.seq
            )
        ).all()
        attempt = session.scalars(select(Attempt)).one()
    assert [(c.run, c.turn, c.replayed) for c in calls] == [
        (1, 0, False),
        (2, 0, True),
        (2, 1, False),
    ]
    assert calls[1].cost_usd == 0
    assert attempt.runs == 2
    assert attempt.cost_usd == pytest.approx(calls[0].cost_usd + calls[2].cost_usd)
    assert job_view(db, job_id)["cost_usd"] == pytest.approx(attempt.cost_usd, abs=1e-6)


def test_the_replayer_goes_live_at_the_first_different_request(tmp_path: Path) -> None:
    from merlin_flow.journal import JournalEntry, Replayer
    from merlin_flow.llm import request_hash
    from merlin_flow.tools import TOOL_SCHEMAS

    script = tmp_path / "script.yaml"
    script.write_text("rules:\n  - reply: {content: live}\n")
    tier = Tier(name="local", model=f"scripted/{script}")
    asked = [{"role": "user", "content": "q"}]
    entry = JournalEntry(
        0,
        request_hash(tier.model, asked, TOOL_SCHEMAS),
        {"role": "assistant", "content": "old"},
        1,
        1,
    )
    replayer = Replayer([entry])
    replayed = replayer(tier, asked, TOOL_SCHEMAS)
    assert (replayed.message["content"], replayed.replayed, replayed.cost_usd) == ("old", True, 0.0)
    other = Replayer([entry])
    live = other(tier, [{"role": "user", "content": "different"}], TOOL_SCHEMAS)
    assert (live.message["content"], live.replayed) == ("live", False)
    # Once live, it stays live even for a request the journal knows.
    assert other(tier, asked, TOOL_SCHEMAS).replayed is False


def test_budget_refuses_the_first_call_it_cannot_pay(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.store import LlmCall

    config = MerlinConfig(tiers=[_priced_tier(tmp_path, price_out=1.0)])
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
    config = MerlinConfig(tiers=[_priced_tier(tmp_path, price_out=1.0)], budget_usd=1.0)
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:2") is Outcome.CONTINUE
    view = job_view(db, job_id)
    assert view["budget_usd"] == 1.0  # from the configuration
    assert 0 < view["cost_usd"] < 1.0


def test_cost_report_of_a_job_with_retries_and_an_escalation(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from datetime import timedelta

    from merlin_flow.config import Limits
    from merlin_flow.costs import costs_since, job_costs, parse_since

    config = _rate_limited_then_premium(
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


def test_the_response_cache_answers_identical_requests_across_jobs_for_free(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.costs import job_costs
    from merlin_flow.store import LlmCall

    tier = _priced_tier(tmp_path, price_out=2.0)
    tasklist = parse_tasklist(ONE_STEP)

    def run(config: MerlinConfig) -> str:
        job_id = create_job(db, settings, tasklist, py_repo, config)
        assert execute_step(db, settings, job_id, "s0", f"{job_id}:a") is Outcome.CONTINUE
        assert verify_step(db, settings, job_id, "s0", f"{job_id}:b") is Outcome.CONTINUE
        assert finalize_job(db, settings, job_id) == "completed"
        return job_id

    cached = MerlinConfig(tiers=[tier], response_cache=True)
    first, second = run(cached), run(cached)
    uncached = run(MerlinConfig(tiers=[tier]))
    paid, hits, again = (job_costs(db, j)["total"] for j in (first, second, uncached))
    assert paid["calls"] == 2
    assert paid["cached_calls"] == 0
    assert paid["cost_usd"] > 0
    assert hits["calls"] == hits["cached_calls"] == 2
    assert hits["cost_usd"] == 0
    assert hits["prompt_tokens"] == 0
    assert again["cached_calls"] == 0
    assert again["cost_usd"] == paid["cost_usd"]
    # Same answers, so the same change; cached calls are marked in the journal.
    tree = [git(py_repo, "rev-parse", f"merlin/{j}^{{tree}}") for j in (first, second)]
    assert tree[0] == tree[1]
    with db.reader() as session:
        marks = session.execute(
            select(LlmCall.cached, LlmCall.replayed).where(LlmCall.job_id == second)
        ).all()
    assert marks == [(True, False), (True, False)]


def test_cancel_between_phases_keeps_the_branch_and_finalizes_at_once(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.control import cancel_job

    job_id = _job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE  # committed
    cancel_job(db, settings, job_id)  # no worker holds the step: closed now
    view = job_view(db, job_id)
    assert (view["status"], view["finished_at"] is not None) == ("cancelled", True)
    assert view["steps"][0]["status"] == "Skipped"
    assert view["steps"][0]["attempts"][0]["status"] == "cancelled"
    # The queued verify message arrives later: it does nothing.
    assert verify_step(db, settings, job_id, "s0", "w:2") is Outcome.STOP
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == git(py_repo, "rev-parse", "main")


def test_cancel_waits_for_the_worker_holding_a_step_or_for_its_lease_to_expire(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.control import cancel_job

    job_id = _job(db, settings, py_repo, tmp_path)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, "attempt", "busy-worker", 30)
    cancel_job(db, settings, job_id)
    view = job_view(db, job_id)
    assert view["status"] == "cancelled"
    assert view["finished_at"] is None  # its worker stops at its next call and closes it
    # The worker died instead: once its lease expired, the sweep closes the job.
    with db.session() as session:
        session.execute(
            update(Step).where(Step.id == step_id).values(lease_expires_at=datetime(2000, 1, 1))
        )
    assert sweep(db, settings, lambda _job: None) == []
    assert job_view(db, job_id)["finished_at"] is not None


def test_resume_refuses_what_it_cannot_do(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.control import cancel_job, resume_job
    from merlin_flow.errors import InputError

    job_id = _job(db, settings, py_repo, tmp_path)
    with pytest.raises(InputError, match="only a failed, cancelled or budget_exceeded"):
        resume_job(db, settings, job_id)
    cancel_job(db, settings, job_id)
    with pytest.raises(InputError, match="already ended"):
        cancel_job(db, settings, job_id)
    with pytest.raises(InputError, match="unknown tier 'gold'"):
        resume_job(db, settings, job_id, tier="gold")
    with db.session() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status="budget_exceeded"))
    with pytest.raises(InputError, match="resume it with a larger --budget"):
        resume_job(db, settings, job_id)
    assert resume_job(db, settings, job_id, budget_usd=2.0) == "s0"
    view = job_view(db, job_id)
    assert (view["status"], view["budget_usd"], view["finished_at"]) == ("pending", 2.0, None)
    assert view["steps"][0]["status"] == "Pending"
