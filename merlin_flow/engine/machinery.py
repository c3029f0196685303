"""Errors of merlin's own machinery, never of a step's work, and what a task does about them.

A step or verify task can fail for reasons that are not the step's: the database or the
broker does not answer, git stumbles on what a killed git left, the disk is full, or
merlin has a bug. None of them ends a job. At the task's boundary (``workers.tasks``)
each error is classified (``classify``) as one ``Trouble``:

- transient: the database, the broker or a git remote did not answer. The work is tried
  again after a pause; past ``TRIES`` the task gives up and the recovery sweep runs the
  step again once its lease expires (the job cannot be parked: that needs the database).
- repairable: git or the file system failed. The job's repository is repaired
  (``workspace.git_repair``: half-made worktree entries, stale locks, temporary packs),
  the failed try's worktrees removed, and the work tried again.
- no space: the disk under MERLIN_HOME is full. Parked at once, waiting for space: the
  sweeper resumes the job once ``min_free_mb`` is free again (``waiting_for_space``).
- internal: an error nobody expected (a bug). Parked at once: another try would fail too.

A step that still cannot run after ``TRIES`` is parked: the job becomes ``parked`` with a
``job_parked`` event naming the step, the trouble and the error; the step is ``Parked``
and keeps its tier (the failed tries are not attempts); ``merlin resume`` continues it.
"""

from __future__ import annotations

import errno
import logging
import shutil
from enum import StrEnum

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.leases import QUEUED, token_tag
from merlin_flow.engine.lifecycle import end_job
from merlin_flow.errors import DiskFull, GitError, RecordInDoubt, RemoteUnavailable
from merlin_flow.settings import Settings
from merlin_flow.store import (
    FINAL_JOB_STATUSES,
    FINISHED_STEP_STATUSES,
    Database,
    Event,
    Job,
    JobStatus,
    Step,
)
from merlin_flow.store.events import EventKind, ParkedData, data_of
from merlin_flow.workspace.git_repair import repair
from merlin_flow.workspace.repository import repository_of
from merlin_flow.workspace.worktree_cleanup import remove

log = logging.getLogger(__name__)

TRIES = 3
"""How many times a task's work is tried before its step is parked (or left to the sweep)."""
PAUSES = (2.0, 8.0)
"""Seconds between tries: after the first failure, after the second."""
NO_SPACE_WORDS = ("no space left on device", "database or disk is full", "disk quota exceeded")
"""How the kernel, SQLite and the tools that pass their errors on say that a disk is full."""


class Trouble(StrEnum):
    """What kind of machinery error stopped a task (see the module docstring)."""

    TRANSIENT = "transient"
    REPAIRABLE = "repairable"
    NO_SPACE = "no_space"
    INTERNAL = "internal"


def classify(exc: BaseException, transient: tuple[type[BaseException], ...] = ()) -> Trouble:
    """The trouble ``exc`` stands for; ``transient`` adds error types of the broker's client."""
    if isinstance(exc, DiskFull) or _says_no_space(exc):
        return Trouble.NO_SPACE
    if isinstance(exc, (DBAPIError, RecordInDoubt, RemoteUnavailable, ConnectionError, *transient)):
        return Trouble.TRANSIENT
    if isinstance(exc, (GitError, OSError)):
        return Trouble.REPAIRABLE
    return Trouble.INTERNAL


def _says_no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    return any(words in text for words in NO_SPACE_WORDS)


def free_mb(settings: Settings) -> float:
    """Free megabytes on the file system of MERLIN_HOME (of its nearest existing folder)."""
    place = settings.home_dir
    while not place.exists() and place != place.parent:
        place = place.parent
    return shutil.disk_usage(place).free / 1e6


def require_space(settings: Settings) -> None:
    """Raise ``DiskFull`` when less than ``min_free_mb`` is free under MERLIN_HOME."""
    free = free_mb(settings)
    if free < settings.min_free_mb:
        raise DiskFull(
            f"no space left under {settings.home_dir}: {free:.0f} MB free, "
            f"{settings.min_free_mb:g} MB needed (MERLIN_MIN_FREE_MB); waiting for space"
        )


def repair_for(
    db: Database, settings: Settings, job_id: str, token: str, error: str = ""
) -> list[str]:
    """Repair the job's repository after a try failed; remove that try's worktrees.

    ``error`` is what the try failed with: a lock file it names may go (``git_repair``).
    """
    with db.reader() as session:
        location = session.get_one(Job, job_id).repo
    repository = repository_of(location, settings)
    repaired = repair(repository.path, error)
    for path in sorted((settings.worktrees_dir / job_id).glob(f"*-{token_tag(token)}")):
        try:
            remove(repository.path, path)
            repaired.append(str(path))
        except (GitError, OSError) as exc:
            log.warning("job %s: worktree %s of a failed try left: %s", job_id, path, exc)
    return repaired


def hand_over(db: Database, job_id: str, step_key: str, old: str, new: str) -> bool:
    """Give the lease ``old`` holds on the step to ``new`` (the next try); False if not held."""
    with db.session() as session:
        result = session.execute(
            update(Step)
            .where(Step.job_id == job_id, Step.key == step_key, Step.lease_owner == old)
            .values(lease_owner=new)
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def park_job(
    db: Database,
    settings: Settings,
    job_id: str,
    step_key: str,
    token: str,
    trouble: Trouble,
    reason: str,
    tries: int,
) -> bool:
    """Park the job because its step could not run, and finalize it; False if not ours.

    Only while ``token`` holds the step's lease (or nobody does, or its message): a worker
    that lost the step must not park the job another worker now runs. A job that has
    ended, or a step that has, is left as it is.
    """
    with db.session() as session:
        step = session.scalars(
            select(Step).where(Step.job_id == job_id, Step.key == step_key)
        ).first()
        if step is None or step.lease_owner not in (token, None, QUEUED):
            return False
        job = session.get_one(Job, job_id)
        if job.status in FINAL_JOB_STATUSES or step.status in FINISHED_STEP_STATUSES:
            return False
        times = "1 try" if tries == 1 else f"{tries} tries"
        text = f"step {step_key} parked ({trouble}, after {times}): {reason}"
        data: ParkedData = {"trouble": trouble, "tries": tries}
        step.lease_owner = step.lease_expires_at = None
        end_job(session, job_id, step, text, JobStatus.PARKED, data)
    finalize_job(db, settings, job_id)
    return True


def waiting_for_space(db: Database) -> list[str]:
    """The parked jobs whose last park was for want of space, oldest park first."""
    with db.reader() as session:
        events = session.scalars(
            select(Event)
            .join(Job, Job.id == Event.job_id)
            .where(
                Job.status == JobStatus.PARKED,
                Job.finished_at.is_not(None),
                Event.kind == EventKind.JOB_PARKED,
            )
            .order_by(Event.id)
        ).all()
        last = {event.job_id: data_of(event, ParkedData)["trouble"] for event in events}
    return [job_id for job_id, trouble in last.items() if trouble == Trouble.NO_SPACE]


def space_is_back(settings: Settings) -> bool:
    """True when at least ``min_free_mb`` is free under MERLIN_HOME."""
    return free_mb(settings) >= settings.min_free_mb
