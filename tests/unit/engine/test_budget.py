"""Budgets: the first call a job cannot pay is refused; a budget that covers it lets it finish;
calls in flight hold their estimate, so parallel steps cannot spend the last dollar twice."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.budget import BudgetGuard, estimate_attempt
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.verdict import verify_step
from merlin_flow.errors import BudgetExceeded
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import BudgetHold, Database, Job, JobStatus, utcnow
from merlin_flow.tasklist import parse_tasklist
from tests.unit.scripted_jobs import ONE_STEP, priced_tier

HOUR = timedelta(hours=1)


def test_budget_refuses_the_first_call_it_cannot_pay(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.store import LlmCall

    config = MerlinConfig(tiers=[priced_tier(tmp_path, price_out=1.0)])
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


def test_an_escalation_is_priced_as_its_first_call_and_refused_past_the_budget(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config = MerlinConfig(tiers=[priced_tier(tmp_path, price_out=1.0)])
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), py_repo, config, budget_usd=1.0)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    tier = config.tiers[0]
    with db.reader() as session:
        step = session.get_one(Job, job_id).steps[0]
        price = estimate_attempt(db, job_id, 1.0, config.limits, tier, step)
        # Its prompt: the brief, the failures so far, the tools; its completion: the mean.
        assert 0 < price < 0.01
        with pytest.raises(BudgetExceeded, match="escalating on tier 'local'"):
            estimate_attempt(db, job_id, price / 2, config.limits, tier, step)


def test_a_budget_that_covers_the_job_lets_it_finish(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config = MerlinConfig(tiers=[priced_tier(tmp_path, price_out=1.0)], budget_usd=1.0)
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    outcome, _ = verify_step(db, settings, job_id, "s0", "w:2")
    assert outcome is Outcome.CONTINUE
    view = job_view(db, job_id)
    assert view["budget_usd"] == 1.0  # from the configuration
    assert 0 < view["cost_usd"] < 1.0


# Budget holds: a call in flight holds its estimate, so parallel steps cannot overrun.

ASK = [{"role": "user", "content": "hi"}]


def _dollar_a_token(tmp_path: Path) -> Tier:
    """A scripted tier whose prompt is free and whose completion costs $1 a token."""
    return priced_tier(tmp_path, price_out=1e6).model_copy(update={"price_in": 0.0})


def _job(db: Database, budget_usd: float | None) -> str:
    job_id = uuid.uuid4().hex
    with db.session() as session:
        session.add(
            Job(
                id=job_id,
                title="t",
                repo="/nowhere",
                status=JobStatus.RUNNING,
                branch="merlin/t",
                base_commit="0" * 40,
                head_commit="0" * 40,
                tasklist=ONE_STEP,
                config={},
                budget_usd=budget_usd,
            )
        )
    return job_id


def _guard(db: Database, job_id: str, budget_usd: float | None = 1.5, **kw: float) -> BudgetGuard:
    """A guard expecting a 1-token completion: each call is estimated at $1."""
    return BudgetGuard(db, job_id, budget_usd, 1, **kw)


def _holds(db: Database) -> list[tuple[str, float]]:
    with db.reader() as session:
        rows = session.scalars(select(BudgetHold).order_by(BudgetHold.id)).all()
        return [(hold.job_id, hold.amount_usd) for hold in rows]


def test_a_call_in_flight_holds_its_estimate_against_the_job(
    store: Database, tmp_path: Path
) -> None:
    tier = _dollar_a_token(tmp_path)
    job_id, other_job = _job(store, 1.5), _job(store, 1.5)
    first = _guard(store, job_id, hold_seconds=60)
    before = utcnow()
    first.before_call(tier, ASK, [])
    assert _holds(store) == [(job_id, 1.0)]
    with store.reader() as session:
        hold = session.get_one(BudgetHold, first.hold_id)
    assert before + timedelta(seconds=59) < hold.expires_at <= utcnow() + timedelta(seconds=60)
    # A second call of the job ($1 more, over the $1.50) is refused and holds nothing.
    with pytest.raises(BudgetExceeded) as caught:
        _guard(store, job_id).before_call(tier, ASK, [])
    assert str(caught.value) == (
        "budget of $1.5000 reached: spent $0.0000, $1.0000 held by calls in flight, and "
        "the next model call on tier 'local' is estimated at $1.0000"
    )
    assert _holds(store) == [(job_id, 1.0)]
    # Another job's budget is its own.
    _guard(store, other_job).before_call(tier, ASK, [])
    assert _holds(store) == [(job_id, 1.0), (other_job, 1.0)]


def test_release_frees_the_hold_for_the_next_call(store: Database, tmp_path: Path) -> None:
    tier = _dollar_a_token(tmp_path)
    job_id = _job(store, 1.5)
    first, second = _guard(store, job_id), _guard(store, job_id)
    first.release()  # nothing held: nothing to do
    first.before_call(tier, ASK, [])
    first.release()
    assert first.hold_id is None
    assert _holds(store) == []
    first.release()  # again: still nothing
    second.before_call(tier, ASK, [])
    assert _holds(store) == [(job_id, 1.0)]


def test_a_guards_next_call_replaces_its_own_hold(store: Database, tmp_path: Path) -> None:
    tier = _dollar_a_token(tmp_path)
    job_id = _job(store, 1.5)
    guard = _guard(store, job_id)
    guard.before_call(tier, ASK, [])
    guard.before_call(tier, ASK, [])  # its previous hold is not counted against it
    with store.reader() as session:  # and is gone: the guard holds one, its latest
        assert session.scalars(select(BudgetHold.id)).all() == [guard.hold_id]
    # Another worker's hold leaves no room: the call is refused, and the guard's own
    # previous hold is released all the same (its call is over).
    with store.session() as session:
        session.add(BudgetHold(job_id=job_id, amount_usd=1.0, expires_at=utcnow() + HOUR))
    with pytest.raises(BudgetExceeded, match=r"\$1\.0000 held by calls in flight"):
        guard.before_call(tier, ASK, [])
    assert guard.hold_id is None
    assert _holds(store) == [(job_id, 1.0)]  # the other worker's only


def test_an_expired_hold_stops_counting(store: Database, tmp_path: Path) -> None:
    tier = _dollar_a_token(tmp_path)
    job_id = _job(store, 1.5)
    killed = _guard(store, job_id)  # its worker dies mid-call: it never releases
    killed.before_call(tier, ASK, [])
    with pytest.raises(BudgetExceeded):
        _guard(store, job_id).check(tier, ASK, [], "escalating")
    with store.session() as session:
        session.get_one(BudgetHold, killed.hold_id).expires_at = utcnow() - timedelta(seconds=1)
    _guard(store, job_id).check(tier, ASK, [], "escalating")
    survivor = _guard(store, job_id)
    survivor.before_call(tier, ASK, [])
    with store.reader() as session:  # the expired hold was deleted on the way
        assert session.scalars(select(BudgetHold.id)).all() == [survivor.hold_id]


def test_check_counts_holds_and_takes_none(store: Database, tmp_path: Path) -> None:
    tier = _dollar_a_token(tmp_path)
    job_id = _job(store, 1.5)
    in_flight = _guard(store, job_id)
    in_flight.before_call(tier, ASK, [])
    with pytest.raises(BudgetExceeded) as caught:
        _guard(store, job_id).check(tier, ASK, [], "escalating")
    assert "$1.0000 held by calls in flight, and escalating on tier 'local'" in str(caught.value)
    in_flight.release()
    checker = _guard(store, job_id)
    checker.check(tier, ASK, [], "escalating")
    assert checker.hold_id is None
    assert _holds(store) == []


def test_without_a_budget_no_hold_is_written(store: Database, tmp_path: Path) -> None:
    job_id = _job(store, None)
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        guard = _guard(store, job_id, None)
        for _ in range(3):
            guard.before_call(_dollar_a_token(tmp_path), ASK, [])
            guard.check(_dollar_a_token(tmp_path), ASK, [], "escalating")
            guard.release()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert statements == []  # not even a read
    assert guard.hold_id is None
    assert _holds(store) == []


def test_racing_calls_on_one_job_hold_one_estimate(store: Database, tmp_path: Path) -> None:
    """Calls of parallel steps race for a budget that fits one: exactly one is let through."""
    tier = _dollar_a_token(tmp_path)
    job_id = _job(store, 1.5)
    racers = 8
    start = threading.Barrier(racers)

    def slow_reads(*args: Any) -> None:
        # Widen the window between reading the holds and writing one, so that a check
        # that is not serialized with the others' holds lets several calls through.
        if "budget_holds" in args[2] and args[2].lstrip().upper().startswith("SELECT"):
            time.sleep(0.05)

    def race(guard: BudgetGuard) -> bool:
        start.wait(timeout=30)
        try:
            guard.before_call(tier, ASK, [])
        except BudgetExceeded:
            return False
        return True

    guards = [_guard(store, job_id) for _ in range(racers)]
    event.listen(store.engine, "after_cursor_execute", slow_reads)
    try:
        with ThreadPoolExecutor(racers) as pool:
            passed = list(pool.map(race, guards))
    finally:
        event.remove(store.engine, "after_cursor_execute", slow_reads)
    assert passed.count(True) == 1
    winner = guards[passed.index(True)]
    with store.reader() as session:
        assert session.scalars(select(BudgetHold.id)).all() == [winner.hold_id]
    assert all(guard.hold_id is None for guard in guards if guard is not winner)
