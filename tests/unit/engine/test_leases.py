"""Leases and the recovery sweep, on SQLite and on Postgres."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.leases import (
    HOST,
    QUEUED,
    Heartbeat,
    claim,
    new_token,
    process_gone,
    renew,
    token_process,
    token_tag,
)
from merlin_flow.engine.recovery import sweep
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Step, utcnow
from merlin_flow.tasklist import parse_tasklist


@pytest.fixture
def db(store: Database) -> Database:
    """The migrated store of each backend (``store``, tests/unit/conftest.py)."""
    return store


def _job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, max_recoveries: int = 2
) -> str:
    script = tmp_path / "s.yaml"
    script.write_text("rules: []\n")
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")],
        limits={"max_recoveries": max_recoveries},  # type: ignore[arg-type]
    )
    tasklist = parse_tasklist(
        {
            "title": "t",
            "steps": [
                {"id": "a", "step_type": "Debug", "description": "x"},
                {"id": "b", "step_type": "Test", "description": "y"},
            ],
        }
    )
    return create_job(db, settings, tasklist, repo, config)


def _step(db: Database, job_id: str, key: str) -> Step:
    with db.session() as session:
        return session.scalars(select(Step).where(Step.job_id == job_id, Step.key == key)).one()


def _set_lease(db: Database, step_id: int, owner: str | None, seconds: float) -> None:
    with db.session() as session:
        session.execute(
            update(Step)
            .where(Step.id == step_id)
            .values(lease_owner=owner, lease_expires_at=utcnow() + timedelta(seconds=seconds))
        )


def test_only_one_claim_wins(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    step = _step(db, job_id, "a")
    assert step.lease_owner == QUEUED
    assert claim(db, step.id, "attempt", "worker-1", 30)
    assert not claim(db, step.id, "attempt", "worker-2", 30)
    assert not claim(db, step.id, "verify", "worker-2", 30)  # wrong phase
    assert renew(db, step.id, "worker-1", 30)
    assert not renew(db, step.id, "worker-2", 30)
    assert _step(db, job_id, "a").deliveries == 1


def test_an_expired_lease_can_be_taken_over(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    step = _step(db, job_id, "a")
    assert claim(db, step.id, "attempt", "worker-1", 30)
    _set_lease(db, step.id, "worker-1", -1)
    assert claim(db, step.id, "attempt", "worker-2", 30)
    assert not renew(db, step.id, "worker-1", 30)
    assert _step(db, job_id, "a").deliveries == 2


def test_sweep_leaves_live_leases_alone(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    step = _step(db, job_id, "a")
    assert claim(db, step.id, "attempt", "worker-1", 30)
    enqueued: list[str] = []
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == []
    assert enqueued == []
    assert _step(db, job_id, "a").lease_owner == "worker-1"


def test_sweep_recovers_then_gives_up_as_worker_lost(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path, max_recoveries=2)
    step = _step(db, job_id, "a")
    enqueued: list[str] = []
    for expected in (1, 2):
        _set_lease(db, step.id, f"dead-worker-{expected}", -1)
        assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == [job_id]
        recovered = _step(db, job_id, "a")
        assert recovered.recoveries == expected
        assert recovered.lease_owner == QUEUED
    assert enqueued == [job_id, job_id]
    _set_lease(db, step.id, "dead-worker-3", -1)
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == []
    view = job_view(db, job_id)
    assert view["status"] == "failed"
    assert "worker lost" in view["error"]
    assert view["steps"][0]["status"] == "Failed"
    assert view["steps"][1]["status"] == "Skipped"
    assert view["finished_at"] is not None


def test_sweep_requeues_a_stale_queued_step_without_counting(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _job(db, settings, py_repo, tmp_path)
    step = _step(db, job_id, "a")
    _set_lease(db, step.id, QUEUED, -1)
    enqueued: list[str] = []
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == [job_id]
    assert _step(db, job_id, "a").recoveries == 0
    # A second sweep right after finds a fresh handoff lease and does nothing.
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == []
    assert enqueued == [job_id]


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
        step_ids = session.scalars(select(Step.id).where(Step.job_id == job_id)).all()
    step_id = min(step_ids)
    assert claim(db, step_id, "attempt", "me", 30)
    with Heartbeat(db, step_id, "me", 0.3) as heartbeat:
        with db.session() as session:
            session.execute(update(Step).where(Step.id == step_id).values(lease_owner="thief"))
        time.sleep(0.25)
        assert heartbeat.lost


def _ended_child() -> subprocess.Popen[bytes]:
    """A child that has exited (a zombie until it is waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return child


def test_a_token_names_this_process_and_its_pid_space() -> None:
    token = new_token()
    host, pid, tag, _worker = token.split(":", 3)
    assert host == HOST
    assert HOST.startswith(f"{os.uname().nodename}/")
    assert len(HOST.rsplit("/", 1)[1]) == 8  # the boot and PID namespace, hashed
    assert (int(pid), token_process(token)) == (os.getpid(), f"{HOST}:{pid}")
    assert token_tag(token) == tag
    assert tag != token_tag(new_token())
    assert not process_gone(token)  # this process runs


def test_a_killed_process_of_this_pid_space_is_gone_at_once() -> None:
    child = _ended_child()
    token = f"{HOST}:{child.pid}:0a1b2c3d:w1@box"
    assert process_gone(token)  # a zombie: killed, not yet reaped
    child.wait()
    assert process_gone(token)  # reaped: no such pid
    # The same pid elsewhere, or in a token that does not name its pid space: not known.
    host = HOST.split("/")[0]
    for other in (f"{host}/ffffffff:{child.pid}:x:w", f"{host}:{child.pid}:x", "", None):
        assert not process_gone(other), other
    assert not process_gone(QUEUED)


def test_a_process_this_one_may_not_signal_or_see_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another user's worker under a /proc mounted hidepid=2: kill(pid, 0) is refused and
    # its /proc entry is hidden. It runs: never taken for gone.
    from merlin_flow.engine import leases

    def refused(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(leases.os, "kill", refused)
    assert not process_gone(f"{HOST}:999999:0a1b2c3d:w1@box")
