"""The tasks' guard: an error of merlin's machinery is tried again, repaired, or parks the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import Ignore
from kombu.exceptions import OperationalError as BrokerError

from merlin_flow.errors import GitError
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from workers import tasks


class Recorder:
    """What the guard did besides the work: the parks and the repairs it asked for."""

    def __init__(self) -> None:
        self.parked: list[tuple[str, int, str]] = []
        self.repaired: list[str] = []


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch, db: Database, tmp_path: Path) -> Recorder:
    seen = Recorder()
    settings = Settings(home=tmp_path / "home", min_free_mb=0)
    monkeypatch.setattr(tasks, "runtime", lambda: (db, settings))
    monkeypatch.setattr(tasks, "PAUSES", (0.0, 0.0))

    def park(*args: Any) -> bool:
        seen.parked.append((args[5], args[7], args[6]))
        return True

    def repair(_db: Any, _settings: Any, _job: str, token: str, _error: str) -> list[str]:
        seen.repaired.append(token)
        return []

    monkeypatch.setattr(tasks, "park_job", park)
    monkeypatch.setattr(tasks, "repair_for", repair)
    monkeypatch.setattr(tasks, "hand_over", lambda *args: True)
    return seen


def failing(*errors: Exception) -> tuple[Any, list[str]]:
    """Work that raises ``errors`` in turn, then returns "done"; and the tokens it was given."""
    tokens: list[str] = []
    left = list(errors)

    def work(_db: Any, _settings: Any, token: str) -> str:
        tokens.append(token)
        if left:
            raise left.pop(0)
        return "done"

    return work, tokens


def test_git_debris_is_repaired_and_tried_again_with_a_new_token(guard: Recorder) -> None:
    work, tokens = failing(GitError("worktree add failed"), GitError("again"))
    assert tasks._guard("j", "s0", work) == "done"
    assert len(set(tokens)) == 3  # each try holds the lease under its own token
    assert guard.repaired == tokens[:2]
    assert guard.parked == []


def test_a_repairable_error_past_its_tries_parks_the_job(guard: Recorder) -> None:
    work, tokens = failing(*(GitError("fatal: bad object") for _ in range(3)))
    with pytest.raises(Ignore):
        tasks._guard("j", "s0", work)
    assert len(tokens) == 3
    assert guard.parked == [("repairable", 3, "GitError: fatal: bad object")]


def test_a_bug_parks_at_once(guard: Recorder) -> None:
    work, tokens = failing(KeyError("x"))
    with pytest.raises(Ignore):
        tasks._guard("j", "s0", work)
    assert len(tokens) == 1
    assert guard.parked == [("internal", 1, "KeyError: 'x'")]


def test_a_full_disk_parks_before_any_work(
    guard: Recorder, monkeypatch: pytest.MonkeyPatch, db: Database, tmp_path: Path
) -> None:
    full = Settings(home=tmp_path / "home", min_free_mb=1e12)
    monkeypatch.setattr(tasks, "runtime", lambda: (db, full))
    work, tokens = failing()
    with pytest.raises(Ignore):
        tasks._guard("j", "s0", work)
    assert tokens == []
    assert [p[0] for p in guard.parked] == ["no_space"]


def test_a_broker_still_down_after_its_tries_is_left_to_the_sweep(guard: Recorder) -> None:
    work, tokens = failing(*(BrokerError("refused") for _ in range(3)))
    with pytest.raises(BrokerError):
        tasks._guard("j", "s0", work)
    assert len(tokens) == 3
    assert guard.parked == []
    assert guard.repaired == []
    work, _ = failing(BrokerError("refused"))
    assert tasks._guard("j", "s0", work) == "done"


def test_a_lease_that_cannot_be_handed_over_stays_with_its_token(
    guard: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: Any) -> bool:
        raise BrokerError("the database is down too")

    monkeypatch.setattr(tasks, "hand_over", down)
    work, tokens = failing(GitError("worktree add failed"))
    assert tasks._guard("j", "s0", work) == "done"
    assert tokens[0] == tokens[1]  # the next try claims the lease its token still holds
