"""The three Celery tasks of a job: step, verify and finalize.

Messages carry a job id and a step key only; each task loads its rows and does what the
database says is left (``merlin_flow.attempt``, ``merlin_flow.verdict``,
``merlin_flow.lifecycle``). Which queue a task goes to is stated once, in ``QUEUES``,
and applied by the app's ``task_routes`` (``workers.app``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import shared_task
from celery.exceptions import Ignore
from sqlalchemy.exc import DBAPIError

from merlin_flow.attempt import execute_step
from merlin_flow.errors import RemoteUnavailable
from merlin_flow.leases import new_token
from merlin_flow.lifecycle import Outcome, fail_job, finalize_job
from merlin_flow.settings import Settings, get_settings
from merlin_flow.store import Database, open_database
from merlin_flow.verdict import verify_step

log = logging.getLogger(__name__)

STEP_TASK = "merlin.step"
VERIFY_TASK = "merlin.verify"
FINALIZE_TASK = "merlin.finalize"
QUEUES = {STEP_TASK: "llm", VERIFY_TASK: "verify", FINALIZE_TASK: "control"}
"""The queue of each task: model work, exit commands, and the job's bookkeeping."""
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
        raise self.replace(step_task.si(job_id, step_key) | verify_task.si(job_id, step_key))
    if outcome is Outcome.STOP:
        raise Ignore()
    return outcome.value


@shared_task(name=FINALIZE_TASK)
def finalize_task(job_id: str) -> str | None:
    """Close the job: final status and patch file."""
    db, settings = runtime()
    return finalize_job(db, settings, job_id)
