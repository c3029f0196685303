"""Every kind of event a job's history holds, and the data each kind carries.

An event is a row of ``events``: a kind, a message for people, the step it concerns and
a JSON ``data`` object. The kinds and the data's keys are the wire format: they are
what the database holds, what ``merlin logs --json`` and ``merlin watch`` show and what
``merlin costs`` and ``merlin replay`` read back. ``add_event`` is the only writer: it
takes an ``EventKind`` and the payload its kind carries (``DATA``), and refuses any
other, so a kind is never written as a bare string nor with another kind's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypedDict, TypeVar, cast

from sqlalchemy.orm import Session

from merlin_flow.store.models import Event
from merlin_flow.store.status import JobStatus


class EventKind(StrEnum):
    """What happened to a job."""

    JOB_SUBMITTED = "job_submitted"
    """A TaskList or a request was recorded."""
    QUESTION_ANSWERED = "question_answered"
    PLAN_READY = "plan_ready"
    """A request was planned; its plan waits for approval."""
    PLAN_APPROVED = "plan_approved"
    PLAN_REJECTED = "plan_rejected"
    JOB_STARTED = "job_started"
    """A worker began the job's first attempt."""
    SANDBOX_DISABLED = "sandbox_disabled"
    """The job's commands run with `[sandbox] mode = "none"`."""
    JOB_RESUMED = "job_resumed"
    JOB_FAILED = "job_failed"
    JOB_CANCELLED = "job_cancelled"
    JOB_BUDGET_EXCEEDED = "job_budget_exceeded"
    JOB_PARKED = "job_parked"
    """A step could not run for a reason of merlin's own (a full disk, git or the database
    failing past every try, a bug): the job stops, nothing failed, resumable."""
    JOB_FINISHED = "job_finished"
    """The job was closed: its patch and summary are written."""
    JOB_COMPLETED = "job_completed"
    """What the first release wrote at finalize for a completed job: read, never written."""
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    """A step with ``on_failure: continue`` failed alone."""
    STEP_SKIPPED = "step_skipped"
    STEP_INTEGRATED = "step_integrated"
    """A passed step was merged onto a branch its siblings moved, and verified again."""
    STEP_RECOVERED = "step_recovered"
    """The recovery sweep queued a step again (a lost worker, a lost message)."""
    ENVIRONMENT_BUILT = "environment_built"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_RESUMED = "attempt_resumed"
    ATTEMPT_COMMITTED = "attempt_committed"
    ATTEMPT_ERROR = "attempt_error"
    CONTEXT_CONDENSED = "context_condensed"
    """An attempt's conversation was condensed to fit its model's window (docs/context.md)."""
    WRITE_REFUSED = "write_refused"
    """A change a `[permissions]` deny forbids was undone after the attempt."""
    PERMISSIONS_UNENFORCED = "permissions_unenforced"
    """Without the sandbox, commands could read or change what the rules cover."""
    NESTED_REPOSITORY_REMOVED = "nested_repository_removed"
    """An attempt made a git repository inside the worktree: its ``.git`` was removed
    before the commit, which holds the folder's files (``merlin_flow.workspace.staging``)."""
    SECRET_IN_DIFF = "secret_in_diff"
    """An attempt's changes held a secret (named by file, line and kind, never by value):
    none of them was committed, and the attempt failed."""
    VERIFY_FAILED = "verify_failed"
    INTEGRATION_FAILED = "integration_failed"
    SPEC_CHECK = "spec_check"
    """The spec check passed (or had nothing to check)."""
    SPEC_WARNING = "spec_warning"
    """The spec check found violations under the `warn` policy: the step passes."""
    SPEC_VIOLATION = "spec_violation"
    """The spec check found violations under the `fail` policy: the attempt fails."""
    FIX_PLANNED = "fix_planned"
    ESCALATED = "escalated"
    COMMAND_STOPPED = "command_stopped"
    """A step's running command (exit command or the agent's) was killed: its job ended."""


JOB_ENDED: Mapping[JobStatus, EventKind] = {
    JobStatus.FAILED: EventKind.JOB_FAILED,
    JobStatus.CANCELLED: EventKind.JOB_CANCELLED,
    JobStatus.BUDGET_EXCEEDED: EventKind.JOB_BUDGET_EXCEEDED,
    JobStatus.PARKED: EventKind.JOB_PARKED,
}
"""The event of a job ended early, by the status it ended with."""


class AttemptData(TypedDict):
    """Which attempt of the step the event concerns."""

    attempt: int


class AttemptStartedData(TypedDict):
    """A new attempt: its number, kind (``AttemptKind``) and tier."""

    attempt: int
    kind: str
    tier: str


class ExitCodeData(TypedDict):
    """A failed exit command: the attempt and the command's exit code."""

    attempt: int
    exit_code: int


class IntegrationFailedData(TypedDict):
    """A passed attempt that did not merge, or failed again merged onto ``onto``."""

    attempt: int
    onto: str


class IntegratedData(TypedDict):
    """A passed step merged onto ``onto`` as ``commit``, verified by ``commands``."""

    onto: str
    commit: str
    commands: list[str]


class SpecCheckData(TypedDict):
    """A spec check on an attempt: its policy, the specs read, the violations found."""

    attempt: int
    policy: str
    specs: list[str]
    violations: list[str]


class NextAttemptData(TypedDict):
    """A fix or an escalation: the tiers it goes from and to, and the failure's reason."""

    from_tier: str
    to_tier: str
    reason: str


class RecoveredData(TypedDict, total=False):
    """A step taken over from a lost worker: its counted and total losses.

    A step queued because none of its job's steps was running carries none of them.
    """

    recoveries: int
    losses: int
    counted: bool


class ResumedData(TypedDict):
    """A resumed job: the tier its first step restarts on, the steps queued."""

    tier: str
    started: list[str]


class EnvironmentData(TypedDict):
    """A project environment built for the job: where it lies."""

    path: str


class ParkedData(TypedDict):
    """A parked job: what stopped its step (``engine.machinery.Trouble``), after how many tries."""

    trouble: str
    tries: int


class CondensedData(TypedDict):
    """A condensation: how (masked, summarised, dropped), tokens before and after."""

    attempt: int
    how: str
    before: int
    after: int
    forced: bool


class FinishedData(TypedDict):
    """A closed job: its patch file."""

    patch: str


EventData = (
    AttemptData
    | AttemptStartedData
    | ExitCodeData
    | IntegrationFailedData
    | IntegratedData
    | SpecCheckData
    | NextAttemptData
    | RecoveredData
    | ResumedData
    | EnvironmentData
    | FinishedData
    | ParkedData
    | CondensedData
)

DATA: Mapping[EventKind, type[Any]] = {
    EventKind.ATTEMPT_STARTED: AttemptStartedData,
    EventKind.ATTEMPT_RESUMED: AttemptData,
    EventKind.ATTEMPT_COMMITTED: AttemptData,
    EventKind.ATTEMPT_ERROR: AttemptData,
    EventKind.CONTEXT_CONDENSED: CondensedData,
    EventKind.SECRET_IN_DIFF: AttemptData,
    EventKind.NESTED_REPOSITORY_REMOVED: AttemptData,
    EventKind.VERIFY_FAILED: ExitCodeData,
    EventKind.INTEGRATION_FAILED: IntegrationFailedData,
    EventKind.STEP_INTEGRATED: IntegratedData,
    EventKind.SPEC_CHECK: SpecCheckData,
    EventKind.SPEC_WARNING: SpecCheckData,
    EventKind.SPEC_VIOLATION: SpecCheckData,
    EventKind.FIX_PLANNED: NextAttemptData,
    EventKind.ESCALATED: NextAttemptData,
    EventKind.STEP_RECOVERED: RecoveredData,
    EventKind.JOB_RESUMED: ResumedData,
    EventKind.ENVIRONMENT_BUILT: EnvironmentData,
    EventKind.JOB_FINISHED: FinishedData,
    EventKind.JOB_PARKED: ParkedData,
}
"""The data each kind carries; a kind not listed carries none."""

T = TypeVar("T")


def add_event(
    session: Session,
    job_id: str,
    kind: EventKind,
    message: str,
    step_key: str | None = None,
    data: EventData | None = None,
) -> None:
    """Append an event to the job's history; ValueError if ``data`` is not its kind's."""
    keys = set(data or {})
    shape = DATA.get(kind)
    required = shape.__required_keys__ if shape else frozenset()
    allowed = required | (shape.__optional_keys__ if shape else frozenset())
    if not required <= keys <= allowed:
        raise ValueError(f"event {kind}: data {sorted(keys)}, expected {sorted(allowed)}")
    session.add(
        Event(job_id=job_id, step_key=step_key, kind=kind, message=message, data=dict(data or {}))
    )


def data_of(event: Event, shape: type[T]) -> T:
    """The data of a stored event, as the payload its kind carries (``DATA[event.kind]``)."""
    expected = DATA.get(EventKind(event.kind))
    if expected is not shape:
        raise ValueError(f"event {event.kind} carries {expected}, not {shape}")
    return cast(T, event.data or {})
