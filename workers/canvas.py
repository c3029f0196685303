"""The canvas of a job: a chain ``step(s) | verify(s)`` per step that may start, then finalize.

A job starts with one chain per step that needs no other (a plain TaskList: its first
step). When a step passes, its verify task queues the steps whose dependencies have now
all passed and publishes a chain for each (``workers.tasks``), as children of itself:
where the graph forks, one verify starts several chains; where it joins, the database
decides (``dispatch.start_runnable``, under the job's lock), so the step that needs two
others starts once, after the second of them passed. The verify that ends the last step
publishes the finalize.

Escalation: when verification fails and another attempt is planned, the verify task
publishes ``step(s) | verify(s)`` again and ends there. Which tier the new attempt runs
on is read from the step's row, not carried in the message.

Each message is labelled for Flower with its job, step, and the attempt and tier it is
expected to work on, as the store says when the chain is made (``task_label``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import chain
from kombu.exceptions import OperationalError as BrokerError

from merlin_flow.engine.dispatch import PlannedTask, TaskName, remaining_tasks
from merlin_flow.store import Database
from workers.results import StepState, read_steps
from workers.tasks import finalize_signature, step_signature, verify_signature

PUBLISH_ERRORS = (BrokerError, OSError)
"""What publishing raises when the broker cannot be reached (after Celery's retries)."""


def task_chain(
    job_id: str, tasks: list[PlannedTask], steps: Mapping[str, StepState] | None = None
) -> Any:
    """One chain of ``tasks`` (a step's attempt and verdict, or the finalize), labelled.

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


def job_canvas(
    job_id: str, chains: list[list[PlannedTask]], steps: Mapping[str, StepState] | None = None
) -> list[Any]:
    """The chains for what a job waits for, as listed by ``remaining_tasks``."""
    return [task_chain(job_id, tasks, steps) for tasks in chains]


def enqueue_job(db: Database, job_id: str, step_key: str | None = None) -> bool:
    """Publish the chains ``job_id`` waits for (of ``step_key`` only, if given).

    False if there is nothing to publish.
    """
    chains = remaining_tasks(db, job_id, step_key)
    if not chains:
        return False
    for signature in job_canvas(job_id, chains, read_steps(db, job_id)):
        signature.apply_async()
    return True
