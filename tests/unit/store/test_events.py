"""Event kinds and their data: add_event writes a kind only with the data its kind carries."""

from __future__ import annotations

import typing

import pytest
from sqlalchemy import select

from merlin_flow.store import Database, Event, Job, JobStatus
from merlin_flow.store.events import (
    DATA,
    JOB_ENDED,
    EventData,
    EventKind,
    NextAttemptData,
    RecoveredData,
    add_event,
    data_of,
)


def _job(db: Database) -> str:
    with db.session() as session:
        session.add(
            Job(id="j1", title="t", repo="/r", status=JobStatus.RUNNING, branch="b",
                base_commit="a", head_commit="a", tasklist={}, config={})
        )  # fmt: skip
    return "j1"


def test_an_event_is_written_with_its_kinds_data(db: Database) -> None:
    job_id = _job(db)
    data: NextAttemptData = {"from_tier": "local", "to_tier": "premium", "reason": "exit 1"}
    with db.session() as session:
        add_event(session, job_id, EventKind.ESCALATED, "next: premium", "fix", data)
        add_event(session, job_id, EventKind.JOB_STARTED, "job started")
    with db.reader() as session:
        escalated, started = session.scalars(select(Event).order_by(Event.id)).all()
        assert (escalated.kind, escalated.step_key, escalated.data) == ("escalated", "fix", data)
        assert data_of(escalated, NextAttemptData)["to_tier"] == "premium"
        assert (started.kind, started.data) == ("job_started", {})  # as before: an empty object


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (EventKind.ESCALATED, {"to_tier": "premium"}),  # keys missing
        (EventKind.ESCALATED, {"from_tier": "a", "to_tier": "b", "reason": "r", "extra": 1}),
        (EventKind.JOB_STARTED, {"attempt": 1}),  # a kind that carries nothing
        (EventKind.ATTEMPT_ERROR, None),  # a kind that carries its attempt
    ],
)
def test_data_of_another_kind_is_refused_and_nothing_written(
    db: Database, kind: EventKind, data: typing.Any
) -> None:
    job_id = _job(db)
    with db.session() as session, pytest.raises(ValueError, match=f"event {kind}"):
        add_event(session, job_id, kind, "m", None, data)
    with db.reader() as session:
        assert session.scalars(select(Event)).all() == []


def test_optional_keys_may_be_left_out() -> None:
    assert RecoveredData.__required_keys__ == frozenset()
    assert DATA[EventKind.STEP_RECOVERED] is RecoveredData


def test_reading_an_event_as_another_kinds_data_is_refused(db: Database) -> None:
    job_id = _job(db)
    with db.session() as session:
        add_event(session, job_id, EventKind.JOB_STARTED, "job started")
    with db.reader() as session:
        started = session.scalars(select(Event)).one()
        with pytest.raises(ValueError, match="job_started carries None"):
            data_of(started, NextAttemptData)


def test_every_payload_belongs_to_a_kind_and_every_early_end_has_its_event() -> None:
    assert set(typing.get_args(EventData)) == set(DATA.values())
    assert set(JOB_ENDED) == {
        JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.BUDGET_EXCEEDED, JobStatus.PARKED
    }  # fmt: skip
    assert all(kind.value == f"job_{status}" for status, kind in JOB_ENDED.items())
