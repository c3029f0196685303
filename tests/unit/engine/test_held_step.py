"""A held step: its lease claimed for the work, lost or taken, and the faults that end its job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.held_step import HeldStep, job_has_ended, load_step
from merlin_flow.engine.leases import Heartbeat, claim, new_token, token_tag
from merlin_flow.errors import LeaseLost, SandboxUnavailable, SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, Phase
from merlin_flow.tool_config import Environment
from merlin_flow.workspace.repository import repository_of
from tests.conftest import git
from tests.unit.scripted_jobs import scripted_job


def _held(db: Database, settings: Settings, job_id: str, token: str) -> HeldStep:
    with db.reader() as session:
        job, step = load_step(session, job_id, "s0")
        assert job is not None
        assert step is not None
        return HeldStep.of(db, settings, job, step, token)


@pytest.fixture
def job_id(db: Database, settings: Settings, py_repo: Path, tmp_path: Path) -> str:
    return scripted_job(db, settings, py_repo, tmp_path)


def test_work_runs_while_the_step_is_held_and_not_when_another_holds_it(
    db: Database, settings: Settings, job_id: str
) -> None:
    mine, other = _held(db, settings, job_id, new_token()), _held(db, settings, job_id, "x:1:t:w")
    seen: list[Heartbeat] = []
    assert mine.work(Phase.ATTEMPT, lambda beat: seen.append(beat) or Outcome.CONTINUE) == (
        Outcome.CONTINUE
    )
    assert len(seen) == 1
    assert not seen[0].lost
    assert other.work(Phase.ATTEMPT, lambda beat: pytest.fail("ran without the lease")) == (
        Outcome.STOP
    )
    assert mine.work(Phase.VERIFY, lambda beat: pytest.fail("the step is not in verify")) == (
        Outcome.STOP
    )


def test_a_lost_lease_stops_the_work_and_leaves_the_job(
    db: Database, settings: Settings, job_id: str
) -> None:
    held = _held(db, settings, job_id, new_token())

    def lose(beat: Heartbeat) -> Outcome:
        raise LeaseLost("step s0: lease taken over by another worker")

    assert held.work(Phase.ATTEMPT, lose) is Outcome.STOP
    assert not job_has_ended(db, job_id)


@pytest.mark.parametrize("fault", [SetupFailed("setup failed"), SandboxUnavailable("no bwrap")])
def test_a_fault_of_the_machine_fails_the_job_once(
    db: Database, settings: Settings, job_id: str, fault: Exception
) -> None:
    held = _held(db, settings, job_id, new_token())

    def broken(beat: Heartbeat) -> Outcome:
        raise fault

    assert held.work(Phase.ATTEMPT, broken) is Outcome.STOP
    assert job_has_ended(db, job_id)
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        assert (job.status, job.error) == ("failed", str(fault))
        assert job.finished_at is not None


def test_each_execution_has_its_own_worktree_and_a_built_environment_is_recorded(
    db: Database, settings: Settings, job_id: str, py_repo: Path
) -> None:
    token = new_token()
    held = _held(db, settings, job_id, token)
    config = held.config.model_copy(update={"environment": Environment(setup=["true"])})
    held = replace(held, config=config)
    assert held.worktree("s0-1").name == f"s0-1-{token_tag(token)}"
    assert held.worktree("s0-1") != _held(db, settings, job_id, new_token()).worktree("s0-1")
    assert claim(db, held.step_id, Phase.ATTEMPT, token, 60)
    repository = repository_of(str(py_repo), settings)
    with held.checkout(repository, git(py_repo, "rev-parse", "HEAD"), "s0-1") as checkout:
        assert checkout.worktree == held.worktree("s0-1")
        assert checkout.environment is not None
    with db.reader() as session:
        event = session.scalars(select(Event).where(Event.kind == "environment_built")).one()
        assert event.step_key == "s0"
        assert event.data == {"path": str(checkout.environment.path)}


def test_a_commit_subject_is_the_step_key_and_the_first_line_cut_to_72(
    db: Database, settings: Settings, job_id: str
) -> None:
    held = _held(db, settings, job_id, new_token())
    long = "Fix the parser " + "x" * 56 + " and more\n\nDetails on the second line"
    assert held.commit_subject(long) == f"merlin(s0): Fix the parser {'x' * 56}"
    assert held.commit_subject("Add a cache   \nmore") == "merlin(s0): Add a cache"
    assert len(held.commit_subject("y" * 100)) == len("merlin(s0): ") + 72
