"""The canvas of a job: ``step(s1) | verify(s1) | step(s2) | verify(s2) | ... | finalize``.

Escalation: when verification fails and another attempt is planned, the verify task
*replaces itself* with ``step(sN) | verify(sN)``; Celery re-attaches the rest of the chain
behind the replacement, so the job goes on once the step passes. Which tier the new
attempt runs on is read from the step's row, not carried in the message.
"""

from __future__ import annotations

from typing import Any

from celery import chain

from merlin_flow.lifecycle import PlannedTask, TaskName, remaining_tasks
from merlin_flow.store import Database
from workers.tasks import finalize_task, step_task, verify_task


def step_signature(job_id: str, step_key: str) -> Any:
    """Signature of the step task (immutable: results are not passed along)."""
    return step_task.si(job_id, step_key)


def verify_signature(job_id: str, step_key: str) -> Any:
    """Signature of the verify task."""
    return verify_task.si(job_id, step_key)


def job_canvas(job_id: str, tasks: list[PlannedTask]) -> Any:
    """The chain for what is left of a job, as listed by ``remaining_tasks``."""
    signatures = []
    for task in tasks:
        if task.name is TaskName.FINALIZE or task.step_key is None:
            signatures.append(finalize_task.si(job_id))
        elif task.name is TaskName.STEP:
            signatures.append(step_signature(job_id, task.step_key))
        else:
            signatures.append(verify_signature(job_id, task.step_key))
    return chain(*signatures)


def enqueue_job(db: Database, job_id: str) -> bool:
    """Publish the chain for what is left of ``job_id``; False if nothing is left."""
    tasks = remaining_tasks(db, job_id)
    if not tasks:
        return False
    job_canvas(job_id, tasks).apply_async()
    return True
