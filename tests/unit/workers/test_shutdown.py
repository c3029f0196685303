"""A warm shutdown, bounded: the running steps handed back, no loss counted, no wait.

Issue 45: a worker told to stop (SIGTERM) waited for its running step, a 40 s command,
and exited 42 s later. No worker is started here: the grace runs with fakes for Celery's
pool, and the hand-back on a real store (`tests/e2e/test_worker.py` stops real workers).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from merlin_flow.engine.leases import HOST, QUEUED, claim
from merlin_flow.engine.recovery import sweep
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, Phase, Step
from tests.unit.scripted_jobs import scripted_job
from workers.shutdown import DEFAULT_GRACE, ShutdownBound, hand_back, hold, process_gone


def _gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def _held(db: Database, settings: Settings, repo: Path, tmp_path: Path, pid: int) -> str:
    """A job whose one step a task of process ``pid`` holds, in its attempt."""
    job_id = scripted_job(db, settings, repo, tmp_path)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, Phase.ATTEMPT, f"{HOST}:{pid}:abcd1234:merlin-all@host", 60)
    return job_id


def _step(db: Database, job_id: str) -> Step:
    with db.reader() as session:
        step = session.scalars(select(Step).where(Step.job_id == job_id)).one()
        session.expunge(step)
        return step


def _recovered(db: Database, job_id: str) -> list[tuple[str, object]]:
    with db.reader() as session:
        events = session.scalars(
            select(Event).where(Event.job_id == job_id, Event.kind == "step_recovered")
        ).all()
        return [(event.message, event.data) for event in events]


def test_a_handed_back_step_is_queued_with_no_loss_counted(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    stopped = _held(db, settings, py_repo, tmp_path, 4242)
    other = _held(db, settings, py_repo, tmp_path, 4343)
    assert hand_back(db, settings, [4242]) == [(stopped, "s0")]
    step = _step(db, stopped)
    assert (step.lease_owner, step.phase, step.recoveries, step.losses) == (
        QUEUED, Phase.ATTEMPT, 0, 0,
    )  # fmt: skip
    assert _recovered(db, stopped) == [
        (
            "step s0 handed back: its worker was told to stop while it ran",
            {"recoveries": 0, "losses": 0, "counted": False},
        )
    ]
    assert _step(db, other).lease_owner == f"{HOST}:4343:abcd1234:merlin-all@host"
    assert hand_back(db, settings, [4242]) == []  # handed back once


def test_held_leases_are_not_taken_over_by_a_sweep_once_their_process_is_killed(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    # Without the hold, a sweep of this machine sees the killed process gone at once
    # and takes its step over, counting a loss: repeated deploys would park the step.
    dead = _gone_pid()
    unheld = _held(db, settings, py_repo, tmp_path, dead)
    assert sweep(db, settings, lambda *_: None) == [unheld]
    assert _step(db, unheld).losses == 1

    dead = _gone_pid()
    job_id = _held(db, settings, py_repo, tmp_path, dead)
    token = hold(db, [dead])
    assert token.startswith(f"{HOST}:{os.getpid()}:")
    assert sweep(db, settings, lambda *_: None) == []  # this process is alive
    assert hand_back(db, settings, token=token) == [(job_id, "s0")]
    step = _step(db, job_id)
    assert (step.lease_owner, step.recoveries, step.losses) == (QUEUED, 0, 0)


def test_a_step_of_a_job_cancelled_meanwhile_is_released_and_its_job_closed(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.jobs.control import cancel_job

    job_id = _held(db, settings, py_repo, tmp_path, 4242)
    cancel_job(db, settings, job_id)  # its worker holds the step: it closes the job
    assert hand_back(db, settings, [4242]) == []
    assert _step(db, job_id).lease_owner is None
    with db.reader() as session:
        assert session.get_one(Job, job_id).finished_at is not None


class Pool:
    """Celery's side, faked: the processes running tasks, killed on demand."""

    def __init__(self, *pids: int, ends_after: float | None = None) -> None:
        self.pids = set(pids)
        self.killed: list[int] = []
        self.exited: list[int] = []
        self.published: list[tuple[str, str]] = []
        self.left = 0
        self.ends = None if ends_after is None else time.monotonic() + ends_after

    def running(self) -> set[int]:
        if self.ends is not None and time.monotonic() > self.ends:
            return set()
        return self.pids - set(self.killed)

    def bound(self, db: Database, settings: Settings, grace: float) -> ShutdownBound:
        return ShutdownBound(
            db, settings, grace,
            publish=lambda _db, job, key: self.published.append((job, key)),
            leave=lambda: setattr(self, "left", self.left + 1),
            kill=self.killed.append, running=self.running, exit_now=self.exited.append,
        )  # fmt: skip


def test_tasks_that_end_within_the_grace_are_left_alone(db: Database, settings: Settings) -> None:
    pool = Pool(_gone_pid(), ends_after=0.2)
    bound = pool.bound(db, settings, grace=30)
    started = time.monotonic()
    bound.signalled()
    bound.join(10)
    assert time.monotonic() - started < 5
    assert (pool.killed, pool.exited, bound.handed) == ([], [], [])


def test_past_the_grace_pool_processes_are_killed_and_their_steps_published(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    child = _gone_pid()  # killed already, as far as the store can tell
    job_id = _held(db, settings, py_repo, tmp_path, child)
    pool = Pool(child)
    bound = pool.bound(db, settings, grace=0.3)
    started = time.monotonic()
    bound.signalled()
    bound.join(10)
    assert 0.3 <= time.monotonic() - started < 5
    assert pool.killed == [child]
    assert bound.handed == pool.published == [(job_id, "s0")]
    assert (pool.exited, pool.left) == ([], 0)  # Celery's shutdown goes on as usual
    assert _step(db, job_id).lease_owner == QUEUED


def test_tasks_of_the_workers_own_process_are_handed_back_and_the_process_exits(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _held(db, settings, py_repo, tmp_path, os.getpid())
    pool = Pool(os.getpid())  # a threads or solo pool
    bound = pool.bound(db, settings, grace=0.2)
    bound.signalled()
    bound.join(10)
    assert (pool.killed, pool.published) == ([], [])  # its threads may still run
    assert bound.handed == [(job_id, "s0")]
    assert (pool.left, pool.exited) == (1, [0])
    assert _step(db, job_id).lease_owner == QUEUED


def test_a_second_signal_ends_the_grace_at_once(db: Database, settings: Settings) -> None:
    pool = Pool(_gone_pid())
    bound = pool.bound(db, settings, grace=60)
    started = time.monotonic()
    bound.signalled()
    bound.signalled()
    bound.join(10)
    assert time.monotonic() - started < 5
    assert len(pool.killed) == 1


def test_process_gone() -> None:
    assert not process_gone(os.getpid())
    assert process_gone(_gone_pid())


def test_exit_at_once_flushes_what_was_written_and_keeps_the_code() -> None:
    code = "import logging, sys; from workers.shutdown import exit_at_once\n"
    code += "logging.basicConfig(); logging.warning('logged'); sys.stdout.write('written')\n"
    code += "exit_at_once(3)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, cwd=Path(__file__).parents[3])  # fmt: skip
    assert (done.returncode, done.stdout) == (3, "written")
    assert "logged" in done.stderr


def test_merlin_worker_gives_its_grace_to_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.app
    from merlin_flow.cli.app import app

    started: list[list[str]] = []
    monkeypatch.setattr(workers.app.app, "worker_main", started.append)
    result = CliRunner().invoke(app, ["worker", "--sandbox", "none", "--shutdown-grace", "2.5"])
    assert result.exit_code == 0, result.output
    assert workers.app.app.conf.merlin_shutdown_grace == 2.5
    monkeypatch.setenv("MERLIN_SHUTDOWN_GRACE", "0")
    assert CliRunner().invoke(app, ["worker", "--sandbox", "none"]).exit_code == 0
    assert workers.app.app.conf.merlin_shutdown_grace == 0
    monkeypatch.delenv("MERLIN_SHUTDOWN_GRACE")
    assert CliRunner().invoke(app, ["worker", "--sandbox", "none"]).exit_code == 0
    assert workers.app.app.conf.merlin_shutdown_grace == DEFAULT_GRACE
    assert len(started) == 3
