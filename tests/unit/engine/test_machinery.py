"""Errors of merlin's own machinery: classified, repaired, and a step that cannot run parked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from merlin_flow.engine.leases import claim
from merlin_flow.engine.machinery import (
    Trouble,
    classify,
    hand_over,
    park_job,
    repair_for,
    require_space,
    waiting_for_space,
)
from merlin_flow.errors import DiskFull, GitError, RemoteUnavailable, SetupFailed
from merlin_flow.failures import AttemptKind
from merlin_flow.jobs.control import resume_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, Phase, Step
from tests.conftest import git
from tests.unit.scripted_jobs import scripted_job


class BrokerDown(Exception):
    """Stands for kombu's OperationalError, which only ``workers`` may import."""


@pytest.mark.parametrize(
    ("error", "trouble"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), Trouble.NO_SPACE),
        (GitError("git commit failed: fatal: No space left on device"), Trouble.NO_SPACE),
        (SetupFailed("uv sync: error: No space left on device (os error 28)"), Trouble.NO_SPACE),
        (OperationalError("INSERT", {}, Exception("database or disk is full")), Trouble.NO_SPACE),
        (DiskFull("waiting for space"), Trouble.NO_SPACE),
        (OperationalError("SELECT 1", {}, Exception("server closed")), Trouble.TRANSIENT),
        (RemoteUnavailable("no answer"), Trouble.TRANSIENT),
        (ConnectionResetError(), Trouble.TRANSIENT),
        (BrokerDown("connection refused"), Trouble.TRANSIENT),
        (GitError("fatal: failed to read worktrees/x/commondir"), Trouble.REPAIRABLE),
        (FileNotFoundError(errno.ENOENT, "gone"), Trouble.REPAIRABLE),
        (KeyError("a bug"), Trouble.INTERNAL),
        (SetupFailed("uv sync failed: no such package"), Trouble.INTERNAL),
    ],
)
def test_each_error_is_classified(error: Exception, trouble: Trouble) -> None:
    assert classify(error, transient=(BrokerDown,)) is trouble


def test_a_full_disk_is_refused_before_work(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", min_free_mb=1e12)  # more than any disk
    with pytest.raises(DiskFull, match="MERLIN_MIN_FREE_MB"):
        require_space(settings)
    require_space(Settings(home=tmp_path / "not-made-yet", min_free_mb=0))


def _claimed(db: Database, job_id: str, token: str) -> int:
    with db.reader() as session:
        step = session.scalars(select(Step).where(Step.job_id == job_id)).one()
        step_id = step.id
    assert claim(db, step_id, Phase.ATTEMPT, token, 60)
    return step_id


def test_a_parked_job_keeps_its_step_resumable_on_the_same_tier(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    _claimed(db, job_id, "w:1")
    assert not park_job(db, settings, job_id, "s0", "w:other", Trouble.INTERNAL, "boom", 1)
    assert park_job(db, settings, job_id, "s0", "w:1", Trouble.INTERNAL, "KeyError: 'x'", 1)
    assert not park_job(db, settings, job_id, "s0", "w:1", Trouble.INTERNAL, "again", 1)
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        assert (job.status, job.steps[0].status) == ("parked", "Parked")
        assert job.finished_at is not None
        assert "KeyError: 'x'" in (job.error or "")
        assert "parked (internal" in (job.error or "")
        events = session.scalars(
            select(Event).where(Event.job_id == job_id, Event.kind == "job_parked")
        ).all()
        assert [e.data for e in events] == [{"trouble": "internal", "tries": 1}]
    assert waiting_for_space(db) == []
    assert resume_job(db, settings, job_id, check_tiers=False) == "s0"
    with db.reader() as session:
        step = session.get_one(Job, job_id).steps[0]
        assert (step.status, step.next_kind, step.tier_index) == ("Pending", AttemptKind.EXECUTE, 0)


def test_a_job_parked_for_space_is_listed_as_waiting(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    # Before any worker claimed the step: its message's lease is parked all the same.
    assert park_job(db, settings, job_id, "s0", "w:1", Trouble.NO_SPACE, "DiskFull: full", 1)
    assert waiting_for_space(db) == [job_id]


def test_the_next_try_gets_the_lease_and_a_repaired_repository(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    step_id = _claimed(db, job_id, "host/x:1:aaaa1111:w")
    worktree = settings.worktrees_dir / job_id / "s0-1-aaaa1111"
    git(py_repo, "worktree", "add", "--detach", str(worktree), "HEAD")
    other = settings.worktrees_dir / job_id / "s0-1-bbbb2222"  # another try's: kept
    git(py_repo, "worktree", "add", "--detach", str(other), "HEAD")
    lock = py_repo / ".git" / "index.lock"
    lock.write_text("")
    os.utime(lock, (0, 0))  # left by a git killed long ago
    error = f"fatal: Unable to create '{lock}': File exists."
    repaired = repair_for(db, settings, job_id, "host/x:1:aaaa1111:w", error)
    assert "index.lock" in repaired
    assert str(worktree) in repaired
    assert not worktree.exists()
    assert other.exists()
    assert not lock.exists()
    assert hand_over(db, job_id, "s0", "host/x:1:aaaa1111:w", "host/x:1:cccc3333:w")
    assert not hand_over(db, job_id, "s0", "host/x:1:aaaa1111:w", "host/x:1:dddd:w")
    with db.reader() as session:
        assert session.get_one(Step, step_id).lease_owner == "host/x:1:cccc3333:w"
