"""The recovery sweep: jobs never finalized, one broken job among others, poison steps
or an unlucky machine, and lost messages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from merlin_flow.engine.leases import HOST, QUEUED
from merlin_flow.engine.lifecycle import end_job
from merlin_flow.engine.recovery import MESSAGE_LOST, grace, sweep
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, JobStatus, Step, WorkerBeat, utcnow
from tests.conftest import make_repo
from tests.unit.scripted_jobs import scripted_job


def test_sweep_closes_a_failed_job_that_was_never_finalized(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    with db.session() as session:  # the worker died between failing the job and closing it
        end_job(session, job_id, None, "died", JobStatus.FAILED)
    assert job_view(db, job_id)["finished_at"] is None
    assert sweep(db, settings, lambda *_: None) == []
    view = job_view(db, job_id)
    assert view["finished_at"] is not None
    assert [s["status"] for s in view["steps"]] == ["Skipped", "Skipped"]


def test_one_broken_job_does_not_stop_the_sweep(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    gone = make_repo(tmp_path / "gone", {"pyproject.toml": "", "app.py": "x = 1\n"})
    broken = scripted_job(db, settings, gone, tmp_path)
    with db.session() as session:
        end_job(session, broken, None, "died", JobStatus.FAILED)
    shutil.rmtree(gone)  # finalizing it now fails: its repository is gone
    healthy = scripted_job(db, settings, py_repo, tmp_path)
    with db.session() as session:
        session.execute(
            update(Step).where(Step.job_id == healthy).values(lease_expires_at=datetime(2000, 1, 1))
        )
    enqueued: list[str] = []
    assert sweep(db, settings, lambda job, _key: enqueued.append(job)) == [healthy]
    assert enqueued == [healthy]


def test_a_job_with_nothing_running_or_queued_gets_its_runnable_steps_queued(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    with db.session() as session:  # its queued message and lease were lost together
        session.execute(
            update(Step)
            .where(Step.job_id == job_id)
            .values(lease_owner=None, lease_expires_at=None)
        )
    enqueued: list[tuple[str, str | None]] = []
    assert sweep(db, settings, lambda job, key: enqueued.append((job, key))) == [job_id]
    assert enqueued == [(job_id, "s0")]  # s1 needs s0
    with db.reader() as session:
        event = session.scalars(select(Event).where(Event.kind == "step_recovered")).one()
        assert (event.step_key, event.message, event.data) == ("s0", "step s0 queued: none was", {})
        step = session.scalars(select(Step).where(Step.key == "s0")).one()
        assert step.lease_owner == QUEUED


# Poison or unlucky: a loss counts against a step only when no other step was lost since.


def _lose(db: Database, job_id: str, key: str, owner: str) -> None:
    """The worker ``owner`` holding the step died: its lease is held and expired."""
    with db.session() as session:
        session.execute(
            update(Step)
            .where(Step.job_id == job_id, Step.key == key)
            .values(lease_owner=owner, lease_expires_at=utcnow() - timedelta(seconds=1))
        )


def _row(db: Database, job_id: str, key: str = "s0") -> Step:
    with db.reader() as session:
        return session.scalars(select(Step).where(Step.job_id == job_id, Step.key == key)).one()


def test_an_unlucky_machine_does_not_fail_the_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    first = scripted_job(db, settings, py_repo, tmp_path)
    second = scripted_job(
        db,
        settings,
        make_repo(tmp_path / "r2", {"pyproject.toml": "", "app.py": "x = 1\n"}),
        tmp_path,
    )
    enqueued: list[tuple[str, str | None]] = []
    for death in range(12):  # the machine kills whichever worker, twelve times each
        for job_id in (first, second):
            _lose(db, job_id, "s0", f"host:{death}{job_id[:4]}:x")
            assert sweep(db, settings, lambda job, key: enqueued.append((job, key))) == [job_id]
    for job_id in (first, second):
        view = job_view(db, job_id)
        assert view["status"] == "pending", view["error"]
        step = _row(db, job_id)
        assert step.losses == 12
        assert step.recoveries <= 1  # only a first loss with none before it counts
        assert step.lease_owner == QUEUED
    assert len(enqueued) == 24


def test_a_poison_step_is_parked_after_max_recoveries(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    poison = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    other = scripted_job(
        db,
        settings,
        make_repo(tmp_path / "r2", {"pyproject.toml": "", "app.py": "x = 1\n"}),
        tmp_path,
    )
    _lose(db, poison, "s0", "host:1:a")
    assert sweep(db, settings, lambda *_: None) == [poison]  # counted: 1
    _lose(db, other, "s0", "host:2:a")  # the machine lost another worker meanwhile
    assert sweep(db, settings, lambda *_: None) == [other]
    _lose(db, poison, "s0", "host:3:a")
    assert sweep(db, settings, lambda *_: None) == [poison]  # not counted: another was lost
    assert (_row(db, poison).recoveries, _row(db, poison).losses) == (1, 2)
    for n, counted in ((4, 2), (5, 3)):  # now it dies alone, every time it is delivered
        _lose(db, poison, "s0", f"host:{n}:a")
        assert sweep(db, settings, lambda *_: None) == [poison]
        assert _row(db, poison).recoveries == counted
    _lose(db, poison, "s0", "host:6:a")
    assert sweep(db, settings, lambda *_: None) == []  # the fourth counted loss: parked
    view = job_view(db, poison)
    assert view["status"] == "failed"
    assert "worker lost 4 times with no other step lost in between" in view["error"]
    assert "(max_recoveries = 3)" in view["error"]
    assert "poison" in view["error"]
    assert [s["status"] for s in view["steps"]] == ["Failed", "Skipped"]
    assert view["finished_at"] is not None
    assert job_view(db, other)["status"] == "pending"  # the other job goes on
    assert _row(db, other).lease_owner == QUEUED


def test_steps_lost_in_one_death_both_count_it(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    _lose(db, job_id, "s0", "host:7:a")  # one threaded worker ran both steps
    _lose(db, job_id, "s1", "host:7:b")
    sweep(db, settings, lambda *_: None)
    assert [_row(db, job_id, key).recoveries for key in ("s0", "s1")] == [1, 1]


def test_steps_lost_in_two_deaths_at_once_count_neither(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    _lose(db, job_id, "s0", "host:7:a")  # two workers died together: the machine's doing
    _lose(db, job_id, "s1", "host:8:a")
    sweep(db, settings, lambda *_: None)
    assert [_row(db, job_id, key).recoveries for key in ("s0", "s1")] == [0, 0]
    assert [_row(db, job_id, key).losses for key in ("s0", "s1")] == [1, 1]


def _hold(db: Database, job_id: str, key: str, owner: str, seconds: float = 60) -> None:
    """``owner`` holds the step's lease for ``seconds`` more."""
    with db.session() as session:
        session.execute(
            update(Step)
            .where(Step.job_id == job_id, Step.key == key)
            .values(lease_owner=owner, lease_expires_at=utcnow() + timedelta(seconds=seconds))
        )


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_step_whose_worker_process_is_gone_is_taken_over_before_its_lease_ends(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=3)
    _hold(db, job_id, "s0", f"{HOST}:{_dead_pid()}:0a1b2c3d:w1@box")  # killed here
    _hold(db, job_id, "s1", f"{HOST}:{os.getpid()}:0a1b2c3e:w2@box")  # alive here
    _hold(db, job_id, "s2", f"elsewhere/0a0a0a0a:{_dead_pid()}:0a1b2c3f:w3@far")  # not ours
    enqueued: list[tuple[str, str | None]] = []
    assert sweep(db, settings, lambda job, key: enqueued.append((job, key))) == [job_id]
    assert enqueued == [(job_id, "s0")]
    assert (_row(db, job_id).lease_owner, _row(db, job_id).losses) == (QUEUED, 1)
    assert _row(db, job_id, "s1").lease_owner.endswith("w2@box")  # type: ignore[union-attr]
    assert _row(db, job_id, "s2").lease_owner.endswith("w3@far")  # type: ignore[union-attr]


def test_two_workers_killed_together_count_against_neither_step(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    _hold(db, job_id, "s0", f"{HOST}:{_dead_pid()}:0a1b2c3d:w1@box")
    _hold(db, job_id, "s1", f"{HOST}:{_dead_pid()}:0a1b2c3e:w2@box")
    sweep(db, settings, lambda *_: None)  # the first take-over sees the second death too
    assert [_row(db, job_id, key).recoveries for key in ("s0", "s1")] == [0, 0]
    assert [_row(db, job_id, key).losses for key in ("s0", "s1")] == [1, 1]


def _beat(db: Database, name: str, seconds_ago: float) -> None:
    """Worker ``name`` last beat ``seconds_ago`` (and then went silent, if long ago)."""
    with db.session() as session:
        session.add(
            WorkerBeat(name=name, queues="llm", last_seen=utcnow() - timedelta(seconds=seconds_ago))
        )


def test_an_idle_workers_death_is_seen_in_its_silent_beat(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    # The step's worker dies each time, and so, in between, does an idle worker: its
    # beat went silent (over two sweep intervals ago). The machine's doing: not counted.
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    silent = 3 * settings.sweep_interval
    _lose(db, job_id, "s0", "host:1:a:busy-1@host")
    sweep(db, settings, lambda *_: None)
    assert _row(db, job_id).recoveries == 1  # the first loss, with none before it
    for n in (2, 3):
        with db.session() as session:  # the previous loss, and every beat, long ago
            session.execute(update(WorkerBeat).values(last_seen=datetime(2000, 1, 1)))
            session.execute(
                update(Step)
                .where(Step.job_id == job_id)
                .values(lost_at=utcnow() - timedelta(seconds=silent + 5))
            )
        _beat(db, f"busy-{n}@host", silent)  # the step's own worker: not another death
        _lose(db, job_id, "s0", f"host:{n}:a:busy-{n}@host")
        sweep(db, settings, lambda *_: None)
        assert _row(db, job_id).recoveries == n  # alone in its deaths: each one counts
    with db.session() as session:
        session.execute(
            update(Step)
            .where(Step.job_id == job_id)
            .values(lost_at=utcnow() - timedelta(seconds=silent + 5))
        )
    _beat(db, "idle-1@host", silent)  # an idle worker died since
    _lose(db, job_id, "s0", "host:9:a:busy-9@host")
    sweep(db, settings, lambda *_: None)
    step = _row(db, job_id)
    assert (step.recoveries, step.losses) == (3, 4)
    assert job_view(db, job_id)["status"] == "pending"
    _beat(db, "alive@host", 0)  # a worker beating now is alive: its beat says nothing
    _lose(db, job_id, "s0", "host:10:a:busy-10@host")
    sweep(db, settings, lambda *_: None)
    assert job_view(db, job_id)["status"] == "failed"  # the fourth counted loss: parked


# A lost message: a queued step whose message is not on the broker is published again.


def _queued(db: Database, job_id: str, seconds_ago: float, settings: Settings) -> None:
    with db.session() as session:
        expires = utcnow() + timedelta(seconds=settings.handoff_seconds - seconds_ago)
        session.execute(
            update(Step)
            .where(Step.job_id == job_id, Step.key == "s0")
            .values(lease_owner=QUEUED, lease_expires_at=expires)
        )


def test_a_queued_step_whose_message_is_lost_is_published_again_at_once(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    enqueued: list[tuple[str, str | None]] = []

    def publish(job: str, key: str | None) -> None:
        enqueued.append((job, key))

    _queued(db, job_id, grace(settings) + 1, settings)
    assert sweep(db, settings, publish, lambda: {(job_id, "s0")}) == []  # it is there
    assert sweep(db, settings, publish, lambda: None) == []  # the broker cannot tell
    assert sweep(db, settings, publish, lambda: {("other", "s0")}) == [job_id]  # it is gone
    assert enqueued == [(job_id, "s0")]
    step = _row(db, job_id)
    assert (step.lease_owner, step.recoveries, step.losses) == (QUEUED, 0, 0)
    # The new message was just queued: not looked for before the grace has passed.
    assert sweep(db, settings, publish, set) == []
    with db.reader() as session:
        messages = session.scalars(select(Event.message).where(Event.job_id == job_id)).all()
    assert f"step s0 re-enqueued: {MESSAGE_LOST}" in messages


def test_a_message_just_queued_is_not_taken_for_lost(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    _queued(db, job_id, grace(settings) - 2, settings)  # its publisher may not have sent it
    assert sweep(db, settings, lambda *_: None, set) == []


def test_a_message_taken_by_a_worker_that_just_booted_is_not_taken_for_lost(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """`merlin run`: the job was queued, then its worker booted and took the message."""
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    _queued(db, job_id, grace(settings) + 5, settings)  # queued before the worker booted
    booted = utcnow() - timedelta(seconds=1)  # its sweeper watches since then
    assert sweep(db, settings, lambda *_: None, set, watched_since=booted) == []
    watching = utcnow() - timedelta(seconds=grace(settings) + 1)  # long enough to tell
    assert sweep(db, settings, lambda *_: None, set, watched_since=watching) == [job_id]


def _send(broker: str, job_id: str, key: str, task: str = "merlin.step") -> Any:
    from celery import Celery

    app = Celery("test", broker=broker, set_as_current=False)
    app.send_task(task, args=[job_id, key], queue="llm")
    return app


def test_the_embedded_broker_lists_its_waiting_step_messages(tmp_path: Path) -> None:
    from workers.sweeper import broker_messages

    settings = Settings(home=tmp_path / "home")
    settings.home_dir.mkdir(parents=True)
    assert broker_messages(settings) == set()
    _send(settings.broker, "job1", "s0")
    _send(settings.broker, "job1", "s1", task="merlin.verify")
    _send(settings.broker, "job2", "x", task="merlin.finalize")
    assert broker_messages(settings) >= {("job1", "s0"), ("job1", "s1")}
    assert ("job2", "x") not in (broker_messages(settings) or set())


def test_redis_lists_queued_and_just_delivered_step_messages(
    tmp_path: Path, redis_url: str
) -> None:
    import redis

    from workers.sweeper import broker_messages

    settings = Settings(home=tmp_path / "home", broker_url=redis_url)
    app = _send(redis_url, "job1", "s0")
    _send(redis_url, "job1", "s1", task="merlin.verify")
    assert broker_messages(settings) == {("job1", "s0"), ("job1", "s1")}
    with app.connection_for_read() as connection:  # a worker takes one and does not ack it
        queue = connection.SimpleQueue("llm", no_ack=False)
        queue.get(timeout=5)
        assert broker_messages(settings) == {("job1", "s0"), ("job1", "s1")}
        client = redis.Redis.from_url(redis_url)
        for tag in client.zrange("unacked_index", 0, -1):  # ... and died a while ago
            client.zadd("unacked_index", {tag: time.time() - 2 * grace(settings)})
        client.close()
        assert len(broker_messages(settings) or ()) == 1
        queue.close()
