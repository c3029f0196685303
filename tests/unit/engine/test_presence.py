"""Worker beats: who is alive, what a user is told when nobody is, and the sweeper's beat."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from merlin_flow.engine.presence import (
    MIN_SILENCE_SECONDS,
    beat,
    leave,
    live_workers,
    no_worker_notice,
    silence_limit,
)
from merlin_flow.settings import Settings
from merlin_flow.store import Database, WorkerBeat, utcnow
from workers.sweeper import Sweeper

QUEUES = ("control", "llm", "verify")


def test_a_worker_is_alive_from_its_beat_until_it_leaves(db: Database, settings: Settings) -> None:
    assert live_workers(db, settings) == []
    beat(db, "merlin-all-1@host", list(QUEUES))
    beat(db, "merlin-all-1@host", list(QUEUES))  # a second beat updates the same row
    (seen,) = live_workers(db, settings)
    assert (seen.name, seen.queues) == ("merlin-all-1@host", QUEUES)
    assert no_worker_notice(db, settings, QUEUES) is None
    leave(db, "merlin-all-1@host")
    assert live_workers(db, settings) == []


def test_a_silent_worker_is_taken_for_gone(db: Database, settings: Settings) -> None:
    beat(db, "w@host", list(QUEUES))
    limit = silence_limit(settings)
    assert limit == timedelta(seconds=max(3 * settings.sweep_interval, MIN_SILENCE_SECONDS))
    with db.session() as session:
        session.execute(update(WorkerBeat).values(last_seen=utcnow() - limit - timedelta(1)))
    assert live_workers(db, settings) == []
    notice = no_worker_notice(db, settings, QUEUES)
    assert notice is not None
    assert notice.startswith(
        f"no worker has served any of merlin's queues in the last {int(limit.total_seconds())} s"
    )
    assert "`merlin worker`" in notice


def test_the_notice_names_the_queues_nobody_serves(db: Database, settings: Settings) -> None:
    beat(db, "llm-only@host", ["control", "llm"])
    notice = no_worker_notice(db, settings, QUEUES)
    assert notice is not None
    assert notice.startswith("no worker has served queue verify in the last")


def test_the_sweeper_beats_for_its_worker_and_leaves_when_stopped(
    db: Database, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home", sweep_interval=0.1)
    sweeper = Sweeper(db, settings, "merlin-verify-abc@host", ["verify"])
    sweeper.start()
    deadline = time.monotonic() + 10
    while not live_workers(db, settings) and time.monotonic() < deadline:
        time.sleep(0.05)
    (seen,) = live_workers(db, settings)
    assert (seen.name, seen.queues) == ("merlin-verify-abc@host", ("verify",))
    sweeper.stop()
    sweeper.join(timeout=10)
    assert not sweeper.is_alive()
    assert live_workers(db, settings) == []


def test_a_failed_sweep_is_tried_again_soon_not_a_whole_interval_later(
    db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An outage cuts the sweep's connection: the next sweep must not wait a whole
    # interval, or a killed worker's step waits that much longer to be taken over.
    import workers.sweeper as sweeper_module

    calls: list[str] = []

    def sweep_once_broken(*_: object) -> list[str]:
        calls.append("sweep")
        if len(calls) == 1:
            raise ConnectionError("terminating connection due to administrator command")
        return []

    monkeypatch.setattr(sweeper_module, "run_sweep", sweep_once_broken)
    sweeper = Sweeper(db, settings.model_copy(update={"sweep_interval": 60.0}), "w@h", ["llm"])
    waits: list[float] = []

    def wait(interval: float) -> bool:
        waits.append(interval)
        return len(waits) == 2  # stop after the second sweep

    monkeypatch.setattr(sweeper._stop_event, "wait", wait)
    sweeper.run()
    assert calls == ["sweep", "sweep"]
    assert waits == [sweeper_module.RETRY_SECONDS, 60.0]
