"""Every status merlin stores: of jobs, steps, attempts, and the phase a step is in.

The values are the wire format: they are what the database holds, what ``--json`` and
JUnit reports show and what the docs list. Job and attempt statuses are lowercase; step
statuses are CamelCase (as TaskList files always spelled them).
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Where a job is in its life."""

    PLANNING = "planning"
    """A request being planned (or a question being answered) where it was submitted."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Planned; its steps start once ``merlin approve`` accepts the plan."""
    PENDING = "pending"
    """Submitted; no worker has started a step."""
    RUNNING = "running"
    COMPLETED = "completed"
    """Every step passed and the job was finalized: the job is *complete*."""
    PARTIALLY_COMPLETED = "partially_completed"
    """Every step *finished* (passed, failed or skipped), not every one passed: a step
    with ``on_failure: continue`` failed and the steps that need it were skipped. The
    branch holds the steps that passed."""
    FAILED = "failed"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"
    """Stopped before a call or an escalation its budget could not pay for."""
    REJECTED = "rejected"
    """Its plan was rejected (``merlin reject``): no step ran."""
    PARKED = "parked"
    """Stopped by merlin's own machinery, not by its steps' work: a step could not run
    (a full disk, git or the database failing past every try, a bug). Nothing failed;
    ``merlin resume`` continues it, and a job parked for space resumes once space returns."""


FINAL_JOB_STATUSES = frozenset(
    {
        JobStatus.COMPLETED,
        JobStatus.PARTIALLY_COMPLETED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.BUDGET_EXCEEDED,
        JobStatus.REJECTED,
        JobStatus.PARKED,
    }
)
"""A job with one of these statuses runs no more attempts (it may still be finalizing)."""
RESUMABLE_JOB_STATUSES = frozenset(
    {
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.BUDGET_EXCEEDED,
        JobStatus.PARTIALLY_COMPLETED,
        JobStatus.PARKED,
    }
)
"""``merlin resume`` takes a job that ended with one of these."""


class StepStatus(StrEnum):
    """Where one step is in its life."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    """Never run: a step it depends on failed (``on_failure: continue``), or the job ended."""
    PARKED = "Parked"
    """Could not run for a reason of merlin's own (its job is ``parked``): not failed, its
    tier kept; ``merlin resume`` runs it again."""


FINISHED_STEP_STATUSES = frozenset(
    {StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.PARKED}
)
"""A step with one of these statuses will not run again (unless its job is resumed)."""


class AttemptStatus(StrEnum):
    """What became of one attempt at a step."""

    RUNNING = "running"
    """The agent is working (or its worker was lost: the attempt resumes)."""
    COMMITTED = "committed"
    """The agent's changes are committed; verification is next."""
    ERROR = "error"
    """The attempt could not finish (a model error, no change, the budget...)."""
    PASSED = "passed"
    """The exit command passed on its commit."""
    FAILED = "failed"
    """The exit command failed on its commit."""
    CANCELLED = "cancelled"
    """Its job ended before it was verified."""


OPEN_ATTEMPT_STATUSES = frozenset({AttemptStatus.RUNNING, AttemptStatus.COMMITTED})
"""An attempt with one of these statuses has no verdict yet."""


class Phase(StrEnum):
    """Which task a step waits for."""

    ATTEMPT = "attempt"
    """The step task: the next attempt."""
    VERIFY = "verify"
    """The verify task: the exit command on the last attempt's commit."""
    DONE = "done"
    """Neither: the step has ended."""
