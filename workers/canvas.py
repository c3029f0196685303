"""The canvas of a job: ``step(s1) | verify(s1) | step(s2) | verify(s2) | ... | finalize``.

Escalation: when verification fails and another attempt is planned, the verify task
publishes ``step(sN) | verify(sN)`` with the rest of its chain behind, and ends there
(``workers.tasks``); the job goes on once the step passes. Which tier the new attempt
runs on is read from the step's row, not carried in the message.

Each message is labelled for Flower with its job, step, and the attempt and tier it is
expected to work on, as the store says when the chain is made (``task_label``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import chain

from merlin_flow.lifecycle import PlannedTask, TaskName, remaining_tasks
from merlin_flow.store import Database
from workers.results import StepState, read_steps
from workers.tasks import finalize_signature, step_signature, verify_signature


def job_canvas(
    job_id: str, tasks: list[PlannedTask], steps: Mapping[str, StepState] | None = None
) -> Any:
    """The chain for what is left of a job, as listed by ``remaining_tasks``.

    ``steps`` (``read_steps``) gives the attempt and tier each message is labelled with.
    """
    signatures = []
    for task in tasks:
        if task.name is TaskName.FINALIZE or task.step_key is None:
            signatures.append(finalize_signature(job_id))
            continue
        state = (steps or {}).get(task.step_key)
        attempt, tier = state.label(task.name) if state else (None, None)
        if task.name is TaskName.STEP:
            signatures.append(step_signature(job_id, task.step_key, attempt, tier))
        else:
            signatures.append(verify_signature(job_id, task.step_key, attempt, tier))
    return chain(*signatures)


def enqueue_job(db: Database, job_id: str) -> bool:
    """Publish the chain for what is left of ``job_id``; False if nothing is left."""
    tasks = remaining_tasks(db, job_id)
    if not tasks:
        return False
    job_canvas(job_id, tasks, read_steps(db, job_id)).apply_async()
    return True
