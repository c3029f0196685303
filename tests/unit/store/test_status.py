"""The statuses are the wire format: pinned here, with the sets the engine decides by."""

from __future__ import annotations

from merlin_flow.store.status import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    OPEN_ATTEMPT_STATUSES,
    RESUMABLE_JOB_STATUSES,
    AttemptStatus,
    JobStatus,
    Phase,
    StepStatus,
)


def test_the_values_the_database_and_the_json_hold_are_pinned() -> None:
    assert [s.value for s in JobStatus] == [
        "planning", "awaiting_approval", "pending", "running", "completed",
        "partially_completed", "failed", "cancelled", "budget_exceeded", "rejected",
        "parked",
    ]  # fmt: skip
    assert [s.value for s in StepStatus] == [
        "Pending", "InProgress", "Completed", "Failed", "Skipped", "Parked"
    ]  # fmt: skip
    assert [s.value for s in AttemptStatus] == [
        "running", "committed", "error", "passed", "failed", "cancelled"
    ]  # fmt: skip
    assert [p.value for p in Phase] == ["attempt", "verify", "done"]


def test_the_sets_agree_with_each_other() -> None:
    assert RESUMABLE_JOB_STATUSES < FINAL_JOB_STATUSES
    assert JobStatus.COMPLETED in FINAL_JOB_STATUSES - RESUMABLE_JOB_STATUSES
    assert not {JobStatus.PENDING, JobStatus.RUNNING, JobStatus.PLANNING} & FINAL_JOB_STATUSES
    assert StepStatus.IN_PROGRESS not in FINISHED_STEP_STATUSES
    assert StepStatus.PENDING not in FINISHED_STEP_STATUSES
    assert {AttemptStatus.RUNNING, AttemptStatus.COMMITTED} == OPEN_ATTEMPT_STATUSES
