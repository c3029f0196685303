"""What Flower shows of merlin's tasks: message labels and readable task results.

A message's ``argsrepr`` is a label, ``3f2c9a1b7d4e [local #2] fix``: the job, then the
tier and the attempt, then the step (display only: the arguments stay the job id and the
step key). The step key comes last, so a long one is what Flower's narrow args column
cuts, never the tier. Each task ends with one readable line, the most telling words
first: ``committed 3f2c9a1b7d (attempt 1, execute on local)``, ``passed``, ``job
completed``. A task whose work failed there (an attempt that ended in error, a failed
verification, a job that ended failed or over budget) ends in FAILURE with that line
and no traceback (``workers.tasks``), such as "`pytest -q` exited with code 1 ->
escalate to premium (attempt 3)". The store is read here only to say what happened, never to
decide anything.
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


def task_label(
    job_id: str, step_key: str | None = None, attempt: int | None = None, tier: str | None = None
) -> str:
    """``<job> [<tier> #<attempt>] <step>``: a message's ``argsrepr``, Flower's args column."""
    planned = " ".join(part for part in (tier, f"#{attempt}" if attempt else None) if part)
    parts = (job_id, f"[{planned}]" if planned else None, step_key)
    return " ".join(part for part in parts if part)


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
    exit_command: str | None = None
    """The step's exit command, which a failed verification names."""

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
            select(
                Step.id,
                Step.key,
                Step.status,
                Step.phase,
                Step.tier_index,
                Step.next_kind,
                Step.exit_command,
            )
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
            job.status,
            job.error,
            step.status,
            step.phase,
            last,
            number,
            kind,
            tier,
            exit_command=step.exit_command,
        )
    return states


@dataclass(frozen=True)
class TaskResult:
    """What a task ends with: its readable line, and whether its work failed there."""

    text: str
    failed: bool = False


_UNKNOWN = {
    Outcome.CONTINUE: TaskResult("done"),
    Outcome.RETRY: TaskResult("verification failed; another attempt follows", failed=True),
    Outcome.STOP: TaskResult("stopped"),
}
"""A result when the step cannot be read."""


def _short(text: str | None, limit: int = 200) -> str:
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


def _verdict(attempt: AttemptState | None, exit_command: str | None) -> TaskResult | None:
    """The verification of ``attempt``: what failed, in one line; None while it has none.

    An error (the agent's, the spec check's, a failed integration) says more than the
    exit code that came with it.
    """
    if attempt is None:
        return None
    if attempt.status == AttemptStatus.PASSED:
        return TaskResult("passed")
    if attempt.status == AttemptStatus.CANCELLED:
        return TaskResult("cancelled")
    if attempt.status not in (AttemptStatus.FAILED, AttemptStatus.ERROR):
        return None
    if attempt.error:
        return TaskResult(_short(attempt.error), failed=True)
    if attempt.exit_code:
        command = f"`{_short(exit_command, 60)}`" if exit_command else "the exit command"
        return TaskResult(f"{command} exited with code {attempt.exit_code}", failed=True)
    return TaskResult("verification failed", failed=True)


def step_result(
    step_key: str, before: StepState | None, after: StepState | None, outcome: Outcome
) -> TaskResult:
    """What a step task that ended with ``outcome`` reports (``before``/``after``: the step).

    An attempt that ended in error (a failed model call, no change made) failed there.
    """
    idle = _idle(step_key, before, Phase.ATTEMPT)
    if idle is not None:
        return idle
    if after is None:  # no such step, or the store could not be read
        return _UNKNOWN[outcome]
    attempt = after.last
    if attempt is not None and before is not None and attempt.number != before.next_number:
        attempt = None  # not made by this task
    what = f" (attempt {attempt.number}, {attempt.kind} on {attempt.tier})" if attempt else ""
    if outcome is Outcome.CONTINUE:
        if attempt is None:
            return _UNKNOWN[outcome]
        if attempt.status == AttemptStatus.ERROR:
            return TaskResult(f"{_short(attempt.error) or 'attempt failed'}{what}", failed=True)
        return TaskResult(f"committed {(attempt.commit or '')[:10]}{what}")
    ended = _ended(step_key, after)
    return TaskResult(f"{ended.text}{what}", ended.failed)


def verify_result(
    step_key: str, before: StepState | None, after: StepState | None, outcome: Outcome
) -> TaskResult:
    """What a verify task that ended with ``outcome`` reports (``before``/``after``: the step).

    A failed verification says what failed, then what follows: ``-> fix on local (attempt
    2)``, ``-> escalate to premium (attempt 3)``, ``-> job failed: …``.
    """
    idle = _idle(step_key, before, Phase.VERIFY)
    if idle is not None:
        return idle
    if after is None:  # no such step, or the store could not be read
        return _UNKNOWN[outcome]
    verdict = _verdict(after.last, after.exit_command)
    if outcome is Outcome.CONTINUE:
        return verdict or TaskResult("passed")
    if outcome is Outcome.RETRY:
        action = "escalate to" if after.next_kind == AttemptKind.ESCALATE else "fix on"
        following = f"{action} {after.next_tier} (attempt {after.next_number})"
        failure = verdict.text if verdict else "verification failed"
        return TaskResult(f"{failure} -> {following}", failed=True)
    ended = _ended(step_key, after)
    if verdict is None or (verdict.text == "cancelled" and after.job_status == JobStatus.CANCELLED):
        return ended
    return TaskResult(f"{verdict.text} -> {ended.text}", ended.failed or verdict.failed)
