"""The Celery side of merlin_flow: three tasks and the canvas that chains them.

A job becomes ``step(s1) | verify(s1) | step(s2) | verify(s2) | ... | finalize`` on three
queues (``llm``, ``verify``, ``control``). Messages carry a job id and a step key only;
each task loads its rows and does what the database says is left (``merlin_flow.attempt``,
``merlin_flow.verdict``, ``merlin_flow.lifecycle``).

Escalation: when verification fails and another attempt is planned, the verify task
*replaces itself* with ``step(sN) | verify(sN)``; Celery re-attaches the rest of the chain
behind the replacement, so the job goes on once the step passes. Which tier the new
attempt runs on is read from the step's row, not carried in the message.

This module and ``workers/`` are the only places that import Celery.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import chain, shared_task
from celery.exceptions import Ignore
from sqlalchemy.exc import DBAPIError

from merlin_flow.attempt import execute_step
from merlin_flow.errors import RemoteUnavailable
from merlin_flow.leases import new_token
from merlin_flow.lifecycle import (
    Outcome,
    PlannedTask,
    TaskName,
    fail_job,
    finalize_job,
    remaining_tasks,
)
from merlin_flow.settings import Settings, get_settings
from merlin_flow.store import Database, open_database
from merlin_flow.verdict import verify_step

log = logging.getLogger(__name__)

STEP_TASK = "merlin.step"
VERIFY_TASK = "merlin.verify"
FINALIZE_TASK = "merlin.finalize"
NOOP_TASK = "merlin.noop"
QUEUES = {STEP_TASK: "llm", VERIFY_TASK: "verify", FINALIZE_TASK: "control", NOOP_TASK: "control"}
ALL_QUEUES = ("control", "llm", "verify")

_runtime: dict[str, Any] = {}


def runtime() -> tuple[Database, Settings]:
    """The database and settings of this process (made again after a fork)."""
    if _runtime.get("pid") != os.getpid():
        settings = get_settings()
        _runtime.update(pid=os.getpid(), settings=settings, db=open_database(settings.database))
    return _runtime["db"], _runtime["settings"]


def _guard(job_id: str, step_key: str, work: Any) -> Outcome:
    """Run ``work(db, settings, token)`` and turn unexpected errors into a decision.

    A database error is taken as passing (a failover, a lock timeout), and so is a git
    remote that does not answer: the task fails, our lease expires and the recovery sweep
    runs the step again. Any other error fails
    the job, if this task still holds the step; a task that lost it just stops.
    """
    db, settings = runtime()
    token = new_token()
    try:
        outcome: Outcome = work(db, settings, token)
        return outcome
    except (DBAPIError, RemoteUnavailable):
        log.exception("job %s: database or git remote unreachable; recovered later", job_id)
        raise
    except Exception as exc:
        log.exception("job %s: task failed unexpectedly", job_id)
        reason = f"internal error: {type(exc).__name__}: {exc}"
        fail_job(db, settings, job_id, step_key, token, reason)
        raise Ignore() from None


@shared_task(bind=True, name=STEP_TASK)
def step_task(self: Any, job_id: str, step_key: str) -> str:
    """Make the step's next attempt (agent loop + commit)."""
    outcome = _guard(job_id, step_key, lambda db, s, t: execute_step(db, s, job_id, step_key, t))
    if outcome is Outcome.STOP:
        raise Ignore()
    return outcome.value


@shared_task(bind=True, name=VERIFY_TASK)
def verify_task(self: Any, job_id: str, step_key: str) -> str:
    """Verify the step's last attempt; on failure, replace itself with a new attempt."""
    outcome = _guard(job_id, step_key, lambda db, s, t: verify_step(db, s, job_id, step_key, t))
    if outcome is Outcome.RETRY:
        raise self.replace(step_signature(job_id, step_key) | verify_signature(job_id, step_key))
    if outcome is Outcome.STOP:
        raise Ignore()
    return outcome.value


@shared_task(name=FINALIZE_TASK)
def finalize_task(job_id: str) -> str | None:
    """Close the job: final status and patch file."""
    db, settings = runtime()
    return finalize_job(db, settings, job_id)


@shared_task(name=NOOP_TASK)
def noop_task(marker: str | None = None) -> None:
    """Do nothing (a baseline for the overhead benchmark); touch ``marker`` if given."""
    if marker is not None:
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(f"{time.time():.6f}")


def noop_chain(length: int, marker: str) -> Any:
    """A bare chain of ``length`` no-op tasks, the baseline a job is measured against.

    They alternate the llm and verify queues like a job's step and verify tasks; the
    last one touches ``marker``.
    """
    signatures = [
        noop_task.si().set(queue=("llm", "verify")[index % 2]) for index in range(length - 1)
    ]
    signatures.append(noop_task.si(marker).set(queue="control"))
    return chain(*signatures)


def step_signature(job_id: str, step_key: str) -> Any:
    """Signature of the step task (immutable: results are not passed along)."""
    return step_task.si(job_id, step_key).set(queue=QUEUES[STEP_TASK])


def verify_signature(job_id: str, step_key: str) -> Any:
    """Signature of the verify task."""
    return verify_task.si(job_id, step_key).set(queue=QUEUES[VERIFY_TASK])


def job_canvas(job_id: str, tasks: list[PlannedTask]) -> Any:
    """The chain for what is left of a job, as listed by ``remaining_tasks``."""
    signatures = []
    for task in tasks:
        if task.name is TaskName.FINALIZE or task.step_key is None:
            signatures.append(finalize_task.si(job_id).set(queue=QUEUES[FINALIZE_TASK]))
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
