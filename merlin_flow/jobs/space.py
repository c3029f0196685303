"""A job that waits for disk space: what ``status`` and ``list`` say of a full disk.

A task that meets a full disk parks its job at once, waiting for space: a ``job_parked``
event whose ``trouble`` is ``no_space`` (``merlin_flow.engine.machinery``), and each
worker's sweep resumes the job once ``MERLIN_MIN_FREE_MB`` is free under its
``MERLIN_HOME``. When merlin's database lies on the full disk too (SQLite, in
``MERLIN_HOME``), not even the park can be recorded: the job stays ``running``, and the
recovery sweep takes its steps over once space is back. So besides the store, a view
measures the disk of ``MERLIN_HOME`` on the machine that asks.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from typing import TYPE_CHECKING, TypedDict

from sqlalchemy import select

from merlin_flow.jobs.views import JobListEntry, iso_utc
from merlin_flow.store import Event, Job
from merlin_flow.store.events import EventKind, ParkedData, data_of
from merlin_flow.store.status import JobStatus

if TYPE_CHECKING:
    from datetime import datetime

    from merlin_flow.settings import Settings
    from merlin_flow.store import Database

WAITING = (JobStatus.PENDING, JobStatus.RUNNING)
"""A job in one of these statuses waits for space when the disk of MERLIN_HOME is full."""


class SpaceView(TypedDict):
    """Why a job waits for disk space: ``merlin status --json``'s ``space``."""

    parked: bool
    """The job is ``parked`` for want of space (its last park's trouble is ``no_space``);
    false: it is ``pending`` or ``running`` while the disk is full."""
    parked_at: str | None
    """When it was parked for space (UTC, ISO 8601)."""
    home: str
    """MERLIN_HOME on the machine that asked."""
    free_mb: float | None
    """Megabytes free under MERLIN_HOME now, on that machine; None if not measurable."""
    needed_mb: float
    """MERLIN_MIN_FREE_MB: what a task needs to start, and at which a parked job resumes."""
    full: bool
    """Less than ``needed_mb`` is free now."""


class ListedJob(JobListEntry):
    """One job of ``merlin list --json``: the list entry, and whether it waits for space."""

    waiting_for_space: bool
    """Parked for want of space, or pending or running while the disk of MERLIN_HOME is
    full here (``merlin status JOB`` says more)."""


def measured_free_mb(settings: Settings) -> float | None:
    """Megabytes free under MERLIN_HOME here; None when the disk cannot be asked.

    Measured as the tasks measure it (``engine.machinery.free_mb``: the nearest existing
    folder), without importing the engine: ``list`` and ``status`` would pay 0.26 s more.
    """
    place = settings.home_dir
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        return round(shutil.disk_usage(place).free / 1e6, 1)
    except OSError:
        return None


def _full(free: float | None, settings: Settings) -> bool:
    return free is not None and free < settings.min_free_mb


def parked_for_space(db: Database, job_ids: Collection[str]) -> dict[str, datetime]:
    """Of ``job_ids``, the parked jobs whose last park was for want of space, with its time."""
    if not job_ids:
        return {}
    from merlin_flow.engine.machinery import Trouble  # only once a job is parked

    with db.reader() as session:
        events = session.scalars(
            select(Event)
            .join(Job, Job.id == Event.job_id)
            .where(
                Event.job_id.in_(list(job_ids)),
                Job.status == JobStatus.PARKED,
                Event.kind == EventKind.JOB_PARKED,
            )
            .order_by(Event.id)
        ).all()
        last = {event.job_id: event for event in events}
        return {
            job_id: event.created_at
            for job_id, event in last.items()
            if data_of(event, ParkedData)["trouble"] == Trouble.NO_SPACE
        }


def space_view(
    db: Database, settings: Settings, job_id: str, status: JobStatus
) -> SpaceView | None:
    """Why job ``job_id`` (now in ``status``) waits for disk space; None when it does not.

    A job parked for want of space waits, space back or not (a worker's sweep resumes
    it); a pending or running one waits while the disk of MERLIN_HOME is full here.
    """
    parked = parked_for_space(db, [job_id]) if status == JobStatus.PARKED else {}
    if not parked and status not in WAITING:
        return None
    free = measured_free_mb(settings)
    if not parked and not _full(free, settings):
        return None
    return {
        "parked": bool(parked),
        "parked_at": iso_utc(parked.get(job_id)),
        "home": str(settings.home_dir),
        "free_mb": free,
        "needed_mb": settings.min_free_mb,
        "full": _full(free, settings),
    }


def space_line(space: SpaceView) -> str:
    """What ``merlin status`` prints of ``space``: what waits, for what, until when."""
    needed = f"{space['needed_mb']:g} MB"
    disk = f"the disk of MERLIN_HOME ({space['home']})"
    if space["full"]:
        free = f"{space['free_mb']:.0f} MB free"
        now = f"{disk} is full: {free}, {needed} needed (MERLIN_MIN_FREE_MB)"
    elif space["free_mb"] is not None:
        now = f"{space['free_mb']:.0f} MB are free again under MERLIN_HOME ({space['home']})"
    else:
        now = f"the free space under MERLIN_HOME ({space['home']}) cannot be measured here"
    if not space["parked"]:
        return (
            f"waiting for space: {now}; the job's tasks stop for want of it, and the job "
            f"goes on by itself once {needed} are free"
        )
    when = f"parked for want of space at {space['parked_at']}"
    then = (
        f"a worker's sweep resumes it once {needed} are free"
        if space["full"] or space["free_mb"] is None
        else "a worker's sweep resumes it at its next sweep"
    )
    return f"waiting for space: {when}; {now}; {then}"


def list_waiting(
    db: Database, settings: Settings, jobs: list[JobListEntry]
) -> tuple[list[ListedJob], float | None]:
    """``jobs`` marked ``waiting_for_space``; the free megabytes here, when the disk is full.

    One query for the page's parked jobs and one look at the disk of MERLIN_HOME.
    """
    parked = parked_for_space(db, [job["id"] for job in jobs if job["status"] == JobStatus.PARKED])
    free = measured_free_mb(settings)
    full = _full(free, settings)
    listed: list[ListedJob] = [
        {**job, "waiting_for_space": job["id"] in parked or (full and job["status"] in WAITING)}
        for job in jobs
    ]
    return listed, free if full else None
