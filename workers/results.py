"""What Flower shows of merlin's tasks: message labels and readable task results.

A message's ``argsrepr`` is a label, ``job=… step=… attempt=… tier=…`` (display only: the
arguments stay the job id and the step key). Each task ends with a short result:
``passed``, ``attempt 1 (execute) on local: committed 3f2c9a1b7d``, ``job completed``. A
task whose step failed there (a failed verification, a job that ended failed or over
budget) ends in FAILURE (``StepFailed``), with the text as its exception:
``failed: exit 1 -> escalate to premium (attempt 3)``. The store is read here only to say
what happened, never to decide anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from merlin_flow.engine.dispatch import Outcome, TaskName
from merlin_flow.failures import AttemptKind
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Attempt,
    AttemptStatus,
    Database,
    Job,
    JobStatus,
    Phase,
    Step,
)


class StepFailed(Exception):
    """The end of a task whose step failed there; its text is the task's result in Flower.

    Celery reports a task's exception by its repr, so the repr is the text alone.
    """

    def __repr__(self) -> str:
        return str(self)


def task_label(
    job_id: str, step_key: str | None = None, attempt: int | None = None, tier: str | None = None
) -> str:
    """``job=… step=… attempt=… tier=…``: a message's ``argsrepr``, what Flower shows as args."""
    fields = {"job": job_id, "step": step_key, "attempt": attempt, "tier": tier}
    return " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)


@dataclass(frozen=True)
class AttemptState:
    """An attempt, as far as a label or a result tells of it."""

    number: int
    kind: str
    tier: str
    status: str
    commit: str | None = None
    exit_code: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class StepState:
    """Where a job's step stands: read for what Flower shows, never to decide anything."""

    job_status: str
    job_error: str | None
    step_status: str
    phase: str
    last: AttemptState | None
    """The step's latest attempt."""
    next_number: int
    """The number of the attempt the step task makes next (a running one is resumed)."""
    next_kind: str
    next_tier: str | None

    @property
    def job_ended(self) -> bool:
        """True once the job has a final status."""
        return self.job_status in FINAL_JOB_STATUSES

    def label(self, task: TaskName) -> tuple[int | None, str | None]:
        """The attempt number and tier a queued ``task`` of this step works on."""
        if task is TaskName.VERIFY and self.phase == Phase.VERIFY and self.last is not None:
            return self.last.number, self.last.tier
        return self.next_number, self.next_tier


_ATTEMPT_FIELDS = (
    Attempt.number,
    Attempt.kind,
    Attempt.tier,
    Attempt.status,
    Attempt.commit,
    Attempt.exit_code,
    Attempt.error,
)
"""The columns of an ``AttemptState``, in its order."""


def read_steps(db: Database, job_id: str) -> dict[str, StepState]:
    """The state of each step of ``job_id`` by key (none for a job that does not exist)."""
    with db.reader() as session:
        job = session.execute(
            select(Job.status, Job.error, Job.config).where(Job.id == job_id)
        ).first()
        if job is None:
            return {}
        steps = session.execute(
            select(Step.id, Step.key, Step.status, Step.phase, Step.tier_index, Step.next_kind)
            .where(Step.job_id == job_id)
            .order_by(Step.position)
        ).all()
        attempts = session.execute(
            select(Attempt.step_id, *_ATTEMPT_FIELDS)
            .where(Attempt.step_id.in_([step.id for step in steps]))
            .order_by(Attempt.step_id, Attempt.number)
        ).all()
    tiers = [str(tier.get("name")) for tier in (job.config or {}).get("tiers", [])]
    latest = {row.step_id: AttemptState(*row[1:]) for row in attempts}  # the last one wins
    counts: dict[int, int] = {}
    for row in attempts:
        counts[row.step_id] = counts.get(row.step_id, 0) + 1
    states = {}
    for step in steps:
        last = latest.get(step.id)
        tier: str | None
        if last is not None and last.status == AttemptStatus.RUNNING:
            number, kind, tier = last.number, last.kind, last.tier
        else:
            tier = tiers[step.tier_index] if step.tier_index < len(tiers) else None
            number, kind = counts.get(step.id, 0) + 1, step.next_kind
        states[step.key] = StepState(
            job.status, job.error, step.status, step.phase, last, number, kind, tier
        )
    return states


@dataclass(frozen=True)
class TaskResult:
    """What a task ends with: its readable text, and whether its step failed there."""

    text: str
    failed: bool = False


_UNKNOWN = {Outcome.CONTINUE: "done", Outcome.RETRY: "failed: retrying", Outcome.STOP: "stopped"}
"""A result when the step cannot be read."""


def _short(text: str | None, limit: int = 100) -> str:
    line = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _idle(step_key: str, before: StepState | None, phase: Phase) -> TaskResult | None:
    """The result of a task that had nothing to do (a duplicate, a finished job), or None."""
    if before is None:  # not known
        return None
    if before.job_ended:
        return TaskResult(f"nothing to do: job {before.job_status}")
    if before.phase != phase or before.step_status in FINISHED_STEP_STATUSES:
        status = f"{before.step_status} ({before.phase})"
        return TaskResult(f"nothing to do: step {step_key} is {status}")
    return None


def _ended(step_key: str, after: StepState) -> TaskResult:
    """A task that stopped the chain: the job ended (how), or another worker has the step."""
    if not after.job_ended:
        return TaskResult(f"stopped: another worker has step {step_key}")
    if after.job_status in (JobStatus.CANCELLED, JobStatus.COMPLETED):
        return TaskResult(f"job {after.job_status}")
    reason = f": {_short(after.job_error)}" if after.job_error else ""
    return TaskResult(f"job {after.job_status}{reason}", failed=True)


def _verdict(attempt: AttemptState | None) -> str | None:
    """The verification of ``attempt`` in a word or three; None while it has none."""
    if attempt is None:
        return None
    if attempt.status == AttemptStatus.PASSED:
        return "passed"
    if attempt.status == AttemptStatus.CANCELLED:
        return "cancelled"
    if attempt.status == AttemptStatus.FAILED and attempt.exit_code is not None:
        return f"failed: exit {attempt.exit_code}"
    if attempt.status in (AttemptStatus.FAILED, AttemptStatus.ERROR):
        return f"failed: {_short(attempt.error)}" if attempt.error else "failed"
    return None


def step_result(
    step_key: str, before: StepState | None, after: StepState | None, outcome: Outcome
) -> TaskResult:
    """What a step task that ended with ``outcome`` reports (``before``/``after``: the step)."""
    idle = _idle(step_key, before, Phase.ATTEMPT)
    if idle is not None:
        return idle
    if after is None:  # no such step, or the store could not be read
        return TaskResult(_UNKNOWN[outcome])
    attempt = after.last
    if attempt is not None and before is not None and attempt.number != before.next_number:
        attempt = None  # not made by this task
    what = f"attempt {attempt.number} ({attempt.kind}) on {attempt.tier}" if attempt else ""
    if outcome is Outcome.CONTINUE:
        if attempt is None:
            return TaskResult(_UNKNOWN[outcome])
        if attempt.status == AttemptStatus.ERROR:
            return TaskResult(f"{what}: error: {_short(attempt.error)}")
        return TaskResult(f"{what}: committed {(attempt.commit or '')[:10]}")
    ended = _ended(step_key, after)
    return TaskResult(f"{what} -> {ended.text}" if what else ended.text, ended.failed)


def verify_result(
    step_key: str, before: StepState | None, after: StepState | None, outcome: Outcome
) -> TaskResult:
    """What a verify task that ended with ``outcome`` reports (``before``/``after``: the step)."""
    idle = _idle(step_key, before, Phase.VERIFY)
    if idle is not None:
        return idle
    if after is None:  # no such step, or the store could not be read
        return TaskResult(_UNKNOWN[outcome], failed=outcome is Outcome.RETRY)
    verdict = _verdict(after.last)
    if outcome is Outcome.CONTINUE:
        return TaskResult(verdict or "passed")
    if outcome is Outcome.RETRY:
        action = "escalate to" if after.next_kind == AttemptKind.ESCALATE else "fix on"
        following = f"{action} {after.next_tier} (attempt {after.next_number})"
        return TaskResult(f"{verdict or 'failed'} -> {following}", failed=True)
    ended = _ended(step_key, after)
    if verdict is None or (verdict == "cancelled" and after.job_status == JobStatus.CANCELLED):
        return ended
    return TaskResult(f"{verdict} -> {ended.text}", ended.failed or verdict.startswith("failed"))
