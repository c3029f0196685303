"""Cancel and resume on real git and SQLite."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select, update

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.leases import claim
from merlin_flow.engine.recovery import sweep
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, Step
from tests.conftest import git
from tests.unit.scripted_jobs import scripted_job


def test_cancel_between_phases_keeps_the_branch_and_finalizes_at_once(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.jobs.control import cancel_job

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE  # committed
    cancel_job(db, settings, job_id)  # no worker holds the step: closed now
    view = job_view(db, job_id)
    assert (view["status"], view["finished_at"] is not None) == ("cancelled", True)
    assert view["steps"][0]["status"] == "Skipped"
    assert view["steps"][0]["attempts"][0]["status"] == "cancelled"
    # The queued verify message arrives later: it does nothing.
    assert verify_step(db, settings, job_id, "s0", "w:2")[0] is Outcome.STOP
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == git(py_repo, "rev-parse", "main")


def test_cancel_waits_for_the_worker_holding_a_step_or_for_its_lease_to_expire(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.jobs.control import cancel_job

    job_id = scripted_job(db, settings, py_repo, tmp_path)
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
    from merlin_flow.errors import InputError
    from merlin_flow.jobs.control import cancel_job, resume_job

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    refused = "only a failed, cancelled, budget_exceeded, parked or partially_completed"
    with pytest.raises(InputError, match=refused):
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


def test_resume_corrects_the_exit_command_and_the_configuration(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.config import MerlinConfig, Tier
    from merlin_flow.jobs.control import cancel_job, resume_job
    from merlin_flow.jobs.views import events_since

    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    cancel_job(db, settings, job_id)
    script = tmp_path / "script.yaml"
    # "local" moves to second place; "fresh" is new; the job's steps were on "local".
    config = MerlinConfig(
        tiers=[
            Tier(name="fresh", model=f"scripted/{script}"),
            Tier(name="local", model=f"scripted/{script}"),
        ]
    )
    check = "python -c 'import app; print(\"answer is\", app.answer())'"

    assert resume_job(db, settings, job_id, exit_command=check, config=config) == "s0"

    view = job_view(db, job_id)
    assert [s["exit_command"] for s in view["steps"]] == [check, "python -m pytest -q"]
    assert [s["tier"] for s in view["steps"]] == ["local", "local"]
    with db.reader() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert [t["name"] for t in job.config["tiers"]] == ["fresh", "local"]
    resumed = [e for e in events_since(db, job_id, 0) if e["kind"] == "job_resumed"]
    assert resumed[-1]["message"] == (
        f"job resumed from step s0 on tier local; exit command `{check}` "
        "(was `python -m pytest -q`); configuration from the defaults"
    )
    # The step is verified by the new command.
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    verify_step(db, settings, job_id, "s0", "w:2")
    attempt = job_view(db, job_id)["steps"][0]["attempts"][-1]
    assert (attempt["status"], attempt["exit_code"]) == ("passed", 0)
    assert "answer is 42" in attempt["output_tail"]


def test_resume_routes_a_step_whose_tier_the_new_configuration_lacks(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.config import MerlinConfig, Tier
    from merlin_flow.errors import InputError
    from merlin_flow.jobs.control import cancel_job, resume_job

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    cancel_job(db, settings, job_id)
    other = MerlinConfig(tiers=[Tier(name="other", model=f"scripted/{tmp_path / 'script.yaml'}")])
    with pytest.raises(InputError, match="--exit-command is empty"):
        resume_job(db, settings, job_id, exit_command="  ", config=other)
    assert job_view(db, job_id)["status"] == "cancelled"  # nothing changed
    resume_job(db, settings, job_id, config=other)
    assert job_view(db, job_id)["steps"][0]["tier"] == "other"
