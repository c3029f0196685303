"""Closing a job: its final status, the patch and summary files, its worktrees cleared.

``finalize_job`` is idempotent and safe to run twice at once (the finalize task and a
sweep): the second waits on the job's row lock, then sees the job finished. It closes a
job only when it can be closed (``lifecycle.close_job``): every step finished, or the
job ended early and no worker still runs one of its steps (that worker finalizes).
``fail_job`` ends a job after an unexpected error in one of its tasks, then closes it.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from merlin_flow.engine.lifecycle import close_job, end_job, finish_job
from merlin_flow.engine.summary import job_summary
from merlin_flow.errors import GitError, RemoteUnavailable
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, Job, JobStatus, Step
from merlin_flow.store.events import EventKind
from merlin_flow.workspace.git import patch_bytes
from merlin_flow.workspace.repository import JobRepository, repository_of
from merlin_flow.workspace.worktree_cleanup import clear_job

log = logging.getLogger(__name__)


def fail_job(
    db: Database, settings: Settings, job_id: str, step_key: str | None, token: str, reason: str
) -> bool:
    """Fail a job because of an unexpected error in one of its tasks, and finalize it.

    With a ``step_key``, only while ``token`` holds that step's lease: an error in a
    worker that lost the step must not fail the job another worker now runs. Returns
    whether the job was failed.
    """
    with db.session() as session:
        step = None
        if step_key is not None:
            step = session.scalars(
                select(Step).where(Step.job_id == job_id, Step.key == step_key)
            ).first()
            if step is None or step.lease_owner != token:
                return False
            step.lease_owner = None
            step.lease_expires_at = None
        end_job(session, job_id, step, reason, JobStatus.FAILED)
    finalize_job(db, settings, job_id)
    return True


def finalize_job(db: Database, settings: Settings, job_id: str) -> str | None:
    """Close a job: final status, the patch and summary files, the last event. Idempotent."""
    with db.reader() as session:
        job = session.get(Job, job_id)
        if job is None or job.finished_at is not None:
            return job.status if job else None
        location, base, head = job.repo, job.base_commit, job.head_commit
    repository, unreadable = _patch_source(location, settings, job_id, base, head)
    with db.session() as session:
        # FOR UPDATE: on Postgres a concurrent finalize (the task and a sweep) waits here
        # and then sees finished_at set. SQLite writers are serialized by BEGIN IMMEDIATE.
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            return None
        if job.finished_at is not None or not close_job(session, job):
            return job.status  # finished already; or steps still run (a stale finalize)
        patch = settings.jobs_dir / job_id / f"{job_id}.patch"
        patch.parent.mkdir(parents=True, exist_ok=True)
        if repository is None:
            patch.write_text("")
        else:
            repository.have(job_id, job.base_commit, job.head_commit)
            patch.write_bytes(patch_bytes(repository.path, job.base_commit, job.head_commit))
            # What workers killed on this machine left; other machines' sweeps clear theirs.
            clear_job(settings, job_id, repository.path)
        warnings = session.scalars(
            select(Event.message)
            .where(Event.job_id == job_id, Event.kind == EventKind.SPEC_WARNING)
            .order_by(Event.id)
        ).all()
        patch.with_name("summary.md").write_text(job_summary(job, unreadable, warnings))
        finish_job(session, job, str(patch))
        return job.status


def _patch_source(
    location: str, settings: Settings, job_id: str, base: str, head: str
) -> tuple[JobRepository | None, str | None]:
    """The repository to write the patch from, with its commits; or None and why not.

    A remote that does not answer raises (the finalize runs again later); one that
    refuses for good (deleted, no access) must not keep the job from ending.
    """
    try:
        repository = repository_of(location, settings)
        repository.have(job_id, base, head)  # fetched before finalize takes the job's lock
    except RemoteUnavailable:
        raise
    except GitError as exc:
        log.warning("job %s: no patch: %s", job_id, exc)
        return None, str(exc)
    return repository, None
