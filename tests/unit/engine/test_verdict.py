"""The verify task's work driven directly (no Celery), on real git and SQLite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.leases import QUEUED
from merlin_flow.engine.verdict import verify_step
from merlin_flow.failures import AttemptKind
from merlin_flow.jobs.control import cancel_job
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import AttemptStatus, Database, Event, Job, JobStatus, Phase, StepStatus
from merlin_flow.store.events import EventKind
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.tool_config import Environment
from merlin_flow.workspace.checkout import Checkout
from tests.conftest import git
from tests.unit.scripted_jobs import SCRIPT, scripted_job


def test_step_then_verify_advances_the_branch(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    # A duplicate delivery of the same step message finds the phase moved on.
    assert execute_step(db, settings, job_id, "s0", "w:2") is Outcome.STOP
    assert verify_step(db, settings, job_id, "s0", "w:3")[0] is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "s0", "w:4")[0] is Outcome.STOP
    assert finalize_job(db, settings, job_id) == "completed"
    assert "return 42" in git(py_repo, "show", f"merlin/{job_id}:app.py")
    assert not (settings.worktrees_dir / job_id).exists()
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert "| s0 | Debug | Completed | execute@local: 0 |" in summary


def test_a_moved_job_branch_fails_the_job_instead_of_being_overwritten(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    (py_repo / "other.txt").write_text("someone else's work\n")
    git(py_repo, "add", "other.txt")
    git(py_repo, "commit", "-qm", "other")
    git(py_repo, "branch", "-f", f"merlin/{job_id}", "main")
    moved_to = git(py_repo, "rev-parse", f"merlin/{job_id}")
    assert verify_step(db, settings, job_id, "s0", "w:2")[0] is Outcome.STOP
    view = job_view(db, job_id)
    assert view["status"] == "failed"
    assert "was moved by someone else" in view["error"]
    assert view["finished_at"] is not None
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == moved_to


# -- every path a verdict can take ----------------------------------------------------------

WORKS = SCRIPT
SILENT = "rules: []\n"  # no rule fits: the model call fails, the attempt ends in error


@dataclass(frozen=True)
class Path_:
    """One path of a verdict: the job set up so, and what the verdict must decide."""

    command: str = "true"
    """The step's exit command."""
    script: str = WORKS
    tiers: int = 1
    fix_attempts: int = 1
    on_failure: str = "stop"
    budget: float | None = None
    cancel_during_command: bool = False
    outcome: Outcome = Outcome.CONTINUE
    attempt: AttemptStatus = AttemptStatus.PASSED
    step: StepStatus = StepStatus.COMPLETED
    job: JobStatus = JobStatus.RUNNING
    event: EventKind = EventKind.STEP_COMPLETED
    next_kind: AttemptKind | None = None
    """The attempt planned next (None: none)."""
    next_tier: int = 0
    branch_moves: bool = False


VERDICTS = {
    "the exit command passes: the step completes, the branch moves": Path_(branch_moves=True),
    "it fails with a fix left: a fix on the same tier": Path_(
        command="false", outcome=Outcome.RETRY, attempt=AttemptStatus.FAILED,
        step=StepStatus.IN_PROGRESS, event=EventKind.FIX_PLANNED, next_kind=AttemptKind.FIX,
    ),
    "it fails with no fix left: the next tier": Path_(
        command="false", tiers=2, fix_attempts=0, outcome=Outcome.RETRY,
        attempt=AttemptStatus.FAILED, step=StepStatus.IN_PROGRESS, event=EventKind.ESCALATED,
        next_kind=AttemptKind.ESCALATE, next_tier=1,
    ),
    "it fails on the last tier: the job fails": Path_(
        command="false", fix_attempts=0, outcome=Outcome.STOP, attempt=AttemptStatus.FAILED,
        step=StepStatus.FAILED, job=JobStatus.FAILED, event=EventKind.JOB_FAILED,
    ),
    "it fails on the last tier, on_failure continue: the step fails alone": Path_(
        command="false", fix_attempts=0, on_failure="continue", outcome=Outcome.STOP,
        attempt=AttemptStatus.FAILED, step=StepStatus.FAILED,
        job=JobStatus.PARTIALLY_COMPLETED, event=EventKind.STEP_FAILED,
    ),
    "the escalation costs more than the budget left: the job stops": Path_(
        command="false", tiers=2, fix_attempts=0, budget=0.01, outcome=Outcome.STOP,
        attempt=AttemptStatus.FAILED, step=StepStatus.FAILED, job=JobStatus.BUDGET_EXCEEDED,
        event=EventKind.JOB_BUDGET_EXCEEDED,
    ),
    "the agent could not finish: a fix, the attempt stays in error": Path_(
        script=SILENT, outcome=Outcome.RETRY, attempt=AttemptStatus.ERROR,
        step=StepStatus.IN_PROGRESS, event=EventKind.FIX_PLANNED, next_kind=AttemptKind.FIX,
    ),
    "cancelled while the command ran, passing: the branch stays": Path_(
        cancel_during_command=True, outcome=Outcome.STOP, attempt=AttemptStatus.CANCELLED,
        step=StepStatus.SKIPPED, job=JobStatus.CANCELLED, event=EventKind.JOB_FINISHED,
    ),
    "cancelled while the command ran, failing: no fix": Path_(
        command="false", cancel_during_command=True, outcome=Outcome.STOP,
        attempt=AttemptStatus.FAILED, step=StepStatus.SKIPPED, job=JobStatus.CANCELLED,
        event=EventKind.JOB_FINISHED,
    ),
}  # fmt: skip


@pytest.mark.parametrize("path", VERDICTS.values(), ids=VERDICTS.keys())
def test_every_path_of_a_verdict(
    db: Database,
    settings: Settings,
    py_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: Path_,
) -> None:
    tiers = []
    for n in range(path.tiers):
        script = tmp_path / f"tier{n}.yaml"
        script.write_text(path.script if n == 0 else WORKS)
        price = 1.0 if n == 0 else 1000.0  # USD per million tokens: the next tier costs more
        tiers.append(
            Tier(name=f"t{n}", model=f"scripted/{script}", price_in=price, price_out=price)
        )
    config = MerlinConfig(
        tiers=tiers,
        limits=Limits(fix_attempts=path.fix_attempts),
        environment=Environment(setup=[]),
    )
    steps = [
        {"id": "a", "step_type": "Debug", "description": "answer 42", "exit_command": path.command},
        {"id": "b", "step_type": "Debug", "description": "more", "exit_command": "true"},
    ]
    tasklist = parse_tasklist({"title": "t", "on_failure": path.on_failure, "steps": steps})
    job_id = create_job(db, settings, tasklist, py_repo, config, path.budget)
    base = git(py_repo, "rev-parse", f"merlin/{job_id}")
    assert execute_step(db, settings, job_id, "a", "w:1") is Outcome.CONTINUE
    if path.cancel_during_command:
        ran = Checkout.run_exit_command

        def cancelled_meanwhile(self: Checkout, command: str, config: MerlinConfig) -> Any:
            result = ran(self, command, config)
            cancel_job(db, settings, job_id)
            return result

        monkeypatch.setattr(Checkout, "run_exit_command", cancelled_meanwhile)

    outcome, _ = verify_step(db, settings, job_id, "a", "w:2")

    assert outcome is path.outcome
    if path.outcome is Outcome.STOP and path.job is JobStatus.PARTIALLY_COMPLETED:
        assert finalize_job(db, settings, job_id) == path.job  # b was skipped: all finished
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        step = job.steps[0]
        kinds = session.scalars(select(Event.kind).where(Event.job_id == job_id)).all()
        assert (step.attempts[-1].status, step.status, job.status) == (
            path.attempt,
            path.step,
            path.job,
        )
        assert path.event in kinds
        if path.next_kind is not None:
            assert (step.phase, step.next_kind, step.tier_index) == (
                Phase.ATTEMPT,
                path.next_kind,
                path.next_tier,
            )
            assert step.lease_owner == QUEUED  # a message is on its way for the next attempt
        else:
            assert step.phase == Phase.DONE
        if path.on_failure == "continue":
            assert job.steps[1].status == StepStatus.SKIPPED
    moved = git(py_repo, "rev-parse", f"merlin/{job_id}") != base
    assert moved is path.branch_moves
