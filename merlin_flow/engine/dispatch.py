"""What a job's messages are: the three tasks, what each tells its chain, what is left to send.

A job travels as Celery chains (``workers/canvas.py``): a step's attempt and its verdict,
then, once every step has finished, the finalize. The engine says what each message
should lead to (``Outcome``), which steps a verdict let start (``Dispatch``), and which
messages a job still waits for (``remaining_tasks``); ``workers/`` turns that into
Celery signatures. Nothing here imports Celery.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig
from merlin_flow.engine.graph import is_finished, runnable
from merlin_flow.engine.leases import QUEUED, queued_values
from merlin_flow.store import FINAL_JOB_STATUSES, FINISHED_STEP_STATUSES, Database, Job, Phase


class Outcome(StrEnum):
    """What the task wrapper does after the work."""

    CONTINUE = "continue"
    """Done; let the chain go on."""
    RETRY = "retry"
    """Verification failed and another attempt is planned: run step + verify again."""
    STOP = "stop"
    """Nothing (more) for this message to do: stop the chain."""


class TaskName(StrEnum):
    """The three tasks a job's chain is made of."""

    STEP = "step"
    VERIFY = "verify"
    FINALIZE = "finalize"


@dataclass(frozen=True)
class PlannedTask:
    """One task of what is left of a job: a step's attempt or verdict, or the finalize."""

    name: TaskName
    step_key: str | None = None
    """The step it works on; None for the finalize."""


@dataclass(frozen=True)
class Dispatch:
    """What the end of a step set in motion: the steps it let start, and the job's end."""

    start: tuple[str, ...] = ()
    """Steps whose dependencies have now all passed, queued for a worker, in file order."""
    finalize: bool = False
    """Every step has finished (or the job ended): the job is to be finalized."""


def start_runnable(session: Session, job: Job, handoff_seconds: float) -> Dispatch:
    """Queue the steps whose dependencies have all passed; say whether the job finished.

    Called under the job's lock (``held_step.lock_job``) when a step ends, so that of two
    siblings ending at once, the second sees both passed and queues the step that needs
    both.
    """
    limit = MerlinConfig.model_validate(job.config).limits.max_parallel_steps
    started = runnable(job.steps, limit)
    for step in started:
        for key, value in queued_values(handoff_seconds).items():
            setattr(step, key, value)
    finished = is_finished(step.status for step in job.steps)
    return Dispatch(tuple(step.key for step in started), finished)


def remaining_tasks(db: Database, job_id: str, only: str | None = None) -> list[list[PlannedTask]]:
    """The messages a job waits for, one list per chain to publish.

    Each step queued for its next task (a ``QUEUED`` lease) gets its attempt and verdict,
    or its verdict alone when its attempt awaits one; a job with nothing left to run gets
    its finalize. ``only`` limits it to one step.
    """
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None or job.finished_at is not None:
            return []
        if job.status in FINAL_JOB_STATUSES or is_finished(step.status for step in job.steps):
            return [[PlannedTask(TaskName.FINALIZE)]]
        chains: list[list[PlannedTask]] = []
        for step in job.steps:
            if step.status in FINISHED_STEP_STATUSES or step.lease_owner != QUEUED:
                continue
            if only is not None and step.key != only:
                continue
            verify = PlannedTask(TaskName.VERIFY, step.key)
            attempt = PlannedTask(TaskName.STEP, step.key)
            chains.append([verify] if step.phase == Phase.VERIFY else [attempt, verify])
        return chains
