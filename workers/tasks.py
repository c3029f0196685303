"""The three Celery tasks of a job: step, verify and finalize.

Messages carry a job id and a step key only; each task loads its rows and does what the
database says is left (``merlin_flow.engine.attempt``, ``merlin_flow.engine.verdict``,
``merlin_flow.engine.lifecycle``). Which queue a task goes to is stated once, in
``workers.queues.QUEUES``, and applied by the app's ``task_routes`` (``workers.app``).

A verify that passes its step publishes a chain for each step the pass let start, and
the finalize once every step has finished (``workers.canvas`` tells the whole shape).

Each message is labelled and each task ends with a readable line, for Flower
(``workers.results``). A task whose work failed there (an attempt in error, a failed
verification, a job that ended failed) ends in FAILURE with that line and no traceback:
it first hands the rest of its chain on (``_hand_on``: the verify that follows a failed
attempt, or for a failed verification the next attempt's ``step | verify`` with the
rest behind it), so the chain goes on exactly as after a success, then reports the
failure to Flower itself (``_report_failure``, a ``task-failed`` event) and raises
``Ignore``: the message is acknowledged, nothing else is sent, and the worker logs one
line at INFO. Raising an exception instead would put a traceback on Flower's task page
and, without ``throws``, in the worker's log at ERROR. Errors nobody expected keep
Celery's own FAILURE and traceback (``_guard``). Celery's ``Task.replace`` is not used,
since it would give the new verify the old one's task id and Flower would show both as
one task.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

from celery import chain, shared_task, signature
from celery.exceptions import Ignore
from kombu.exceptions import OperationalError as BrokerError

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Dispatch, Outcome, TaskName
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.leases import new_token
from merlin_flow.engine.machinery import (
    PAUSES,
    TRIES,
    Trouble,
    classify,
    hand_over,
    park_job,
    repair_for,
    require_space,
)
from merlin_flow.engine.verdict import verify_step
from merlin_flow.settings import Settings, get_settings
from merlin_flow.store import (
    Database,
    open_database,
)
from workers.queues import FINALIZE_TASK, STEP_TASK, VERIFY_TASK
from workers.results import (
    StepState,
    TaskResult,
    read_steps,
    step_result,
    task_label,
    verify_result,
)

log = logging.getLogger(__name__)

_runtime: dict[str, Any] = {}


def runtime() -> tuple[Database, Settings]:
    """The database and settings of this process (made again after a fork)."""
    if _runtime.get("pid") != os.getpid():
        settings = get_settings()
        _runtime.update(pid=os.getpid(), settings=settings, db=open_database(settings.database))
    return _runtime["db"], _runtime["settings"]


def _guard(job_id: str, step_key: str, work: Any) -> Any:
    """Run ``work(db, settings, token)``; an error of merlin's own machinery never ends the job.

    Each error is classified (``engine.machinery``): a transient or repairable one is
    tried again after a pause (repaired first, the lease handed to the new try), up to
    ``TRIES``; a full disk, a bug, or a repairable error past its tries parks the job and
    raises Ignore. A transient error past its tries is raised: the task fails, the lease
    expires and the recovery sweep runs the step again (parking needs the database).
    """
    db, settings = runtime()
    token = new_token()
    for tries in range(1, TRIES + 1):
        try:
            require_space(settings)
            return work(db, settings, token)
        except Exception as exc:
            trouble = classify(exc, transient=(BrokerError,))
            log.warning(
                "job %s: step %s: %s error (try %d of %d): %s: %s",
                job_id, step_key, trouble, tries, TRIES, type(exc).__name__, exc,
                exc_info=trouble is Trouble.INTERNAL,
            )  # fmt: skip
            last = tries == TRIES or trouble in (Trouble.NO_SPACE, Trouble.INTERNAL)
            if last and trouble is Trouble.TRANSIENT:
                raise
            if last:
                reason = f"{type(exc).__name__}: {exc}"
                park_job(db, settings, job_id, step_key, token, trouble, reason, tries)
                raise Ignore() from None
            token = _next_try(db, settings, job_id, step_key, token, trouble, tries, str(exc))
    raise AssertionError("unreachable: the last try returns or raises")


def _next_try(
    db: Database, settings: Settings, job_id: str, step_key: str, token: str,
    trouble: Trouble, tries: int, error: str,
) -> str:  # fmt: skip
    """Pause, repair what a repairable ``error`` left, and hand the lease to a new token.

    The new token keeps the next try's worktrees apart from the failed one's. When the
    lease cannot be handed over (the database is down), the next try keeps the old
    token, which still holds the lease (``leases.claim`` takes it again).
    """
    time.sleep(PAUSES[tries - 1])
    if trouble is Trouble.REPAIRABLE:
        try:
            repaired = repair_for(db, settings, job_id, token, error)
            log.info("job %s: repaired before the next try: %s", job_id, repaired or "nothing")
        except Exception as exc:  # the next try meets the same fault, and is classified again
            log.warning("job %s: repair before the next try failed: %s", job_id, exc)
    new = new_token()
    try:
        hand_over(db, job_id, step_key, token, new)
    except Exception as exc:
        log.warning("job %s: the lease stays with the failed try's token: %s", job_id, exc)
        return token
    return new


def _run(job_id: str, step_key: str, work: Any) -> Outcome:
    """``_guard``, with its Ignore (an unexpected error, logged) as STOP: the result says why."""
    try:
        outcome: Outcome = _guard(job_id, step_key, work)
        return outcome
    except Ignore:
        return Outcome.STOP


def _run_verify(job_id: str, step_key: str) -> tuple[Outcome, Dispatch]:
    """``_run`` for the verify task's work, which also says what it let start."""
    try:
        decided: tuple[Outcome, Dispatch] = _guard(job_id, step_key, _verify_work(job_id, step_key))
        return decided
    except Ignore:
        return Outcome.STOP, Dispatch()


# Labels and signatures: what Flower shows as a message's args.


def step_signature(
    job_id: str, step_key: str, attempt: int | None = None, tier: str | None = None
) -> Any:
    """Signature of the step task (immutable: results are not passed along)."""
    label = task_label(job_id, step_key, attempt, tier)
    return step_task.si(job_id, step_key).set(argsrepr=label)


def verify_signature(
    job_id: str, step_key: str, attempt: int | None = None, tier: str | None = None
) -> Any:
    """Signature of the verify task."""
    label = task_label(job_id, step_key, attempt, tier)
    return verify_task.si(job_id, step_key).set(argsrepr=label)


def finalize_signature(job_id: str) -> Any:
    """Signature of the finalize task."""
    return finalize_task.si(job_id).set(argsrepr=task_label(job_id))


# The tasks.


def _read_steps(job_id: str) -> dict[str, StepState]:
    """The job's steps' states for labels; empty if they cannot be read."""
    try:
        db, _ = runtime()
        return read_steps(db, job_id)
    except Exception:
        log.warning("job %s: steps not readable for the messages' labels", job_id)
        return {}


def _read_step(job_id: str, step_key: str) -> StepState | None:
    """The step's state for the task's result; None if there is none or it cannot be read.

    Only what the task shows depends on it: the work and the chain go on all the same.
    """
    try:
        db, _ = runtime()
        return read_steps(db, job_id).get(step_key)
    except Exception:
        log.warning("job %s: step %s not readable for the task's result", job_id, step_key)
        return None


def _end(task: Any, result: TaskResult, started: float, *, last: bool) -> str:
    """End the task with ``result``; with ``last``, the rest of the chain does not follow.

    A failed result ends the task in FAILURE, after the rest of its chain was handed on.
    """
    if last:
        task.request.chain = None
    if result.failed:
        _hand_on(task)
        _fail(task, result.text, time.monotonic() - started)
    return result.text


def _hand_on(task: Any, *first: Any) -> None:
    """Publish ``first`` then the rest of this task's chain, which no longer follows it.

    Published from within the task, they are its children in Flower, as a chain's next
    task is. Nothing is published when there is nothing to follow.
    """
    rest = [signature(queued, app=task.app) for queued in reversed(task.request.chain or [])]
    task.request.chain = None
    if first or rest:
        chain(*first, *rest).apply_async()


def _fail(task: Any, text: str, runtime: float) -> NoReturn:
    """End ``task`` in FAILURE with ``text`` and no traceback: an expected failure."""
    log.info("%s[%s] %s failed: %s", task.name, task.request.id, _label_of(task), text)
    _report_failure(task, text, runtime)
    raise Ignore()


def _label_of(task: Any) -> str:
    return str(getattr(task.request, "argsrepr", None) or task.request.args)


def _report_failure(task: Any, text: str, runtime: float) -> None:
    """Tell Flower (and any event monitor) that ``task`` failed: ``text``, no traceback.

    The ``task-failed`` event Celery sends for an exception, with ``text`` as both the
    exception and the result (the readable line stays in one column of the tasks page)
    and the task's runtime. Not sent for an eager call, or when task events are off. A
    broker that cannot take the event leaves the task STARTED in Flower, with a warning.
    """
    if task.request.is_eager or not task.app.conf.worker_send_task_events:
        return
    try:
        task.send_event("task-failed", exception=text, result=text, runtime=runtime)
    except (BrokerError, OSError):
        log.warning("%s[%s]: its failure not reported to Flower", task.name, task.request.id)


def _queue_next_attempt(task: Any, job_id: str, step_key: str, after: StepState | None) -> None:
    """Publish the step's next attempt and its verify, with the rest of the chain behind.

    The rest of this task's chain (the next steps, finalize) follows the new verify and no
    longer this task, which can then end in FAILURE without stopping the job.
    """
    attempt, tier = (after.next_number, after.next_tier) if after else (None, None)
    _hand_on(
        task,
        step_signature(job_id, step_key, attempt, tier),
        verify_signature(job_id, step_key, attempt, tier),
    )


def _publish(task: Any, job_id: str, dispatch: Dispatch) -> None:
    """Publish a chain for each step ``dispatch`` let start, then the finalize if due.

    They are children of ``task`` (its id their parent, its root theirs), so Flower shows
    a job as one tree: where the graph forks, one verify has several chains below it.
    """
    if not (dispatch.start or dispatch.finalize):
        return
    lineage = {"parent_id": task.request.id, "root_id": task.request.root_id or task.request.id}
    steps = {} if not dispatch.start else _read_steps(job_id)
    for key in dispatch.start:
        attempt, tier = steps[key].label(TaskName.STEP) if key in steps else (None, None)
        chain(
            step_signature(job_id, key, attempt, tier),
            verify_signature(job_id, key, attempt, tier),
        ).apply_async(**lineage)
    if dispatch.finalize:
        chain(finalize_signature(job_id)).apply_async(**lineage)


def _attempt_work(job_id: str, step_key: str) -> Callable[[Database, Settings, str], Outcome]:
    return lambda db, settings, token: execute_step(db, settings, job_id, step_key, token)


def _verify_work(
    job_id: str, step_key: str
) -> Callable[[Database, Settings, str], tuple[Outcome, Dispatch]]:
    return lambda db, settings, token: verify_step(db, settings, job_id, step_key, token)


@shared_task(bind=True, name=STEP_TASK)
def step_task(self: Any, job_id: str, step_key: str) -> str:
    """Make the step's next attempt (agent loop + commit).

    An attempt that ended in error ends this task in FAILURE; its verify follows all the
    same, and decides what comes next.
    """
    started = time.monotonic()
    before = _read_step(job_id, step_key)
    outcome = _run(job_id, step_key, _attempt_work(job_id, step_key))
    result = step_result(step_key, before, _read_step(job_id, step_key), outcome)
    return _end(self, result, started, last=outcome is not Outcome.CONTINUE)


@shared_task(bind=True, name=VERIFY_TASK)
def verify_task(self: Any, job_id: str, step_key: str) -> str:
    """Verify the step's last attempt; on failure, queue the next attempt, or end the job.

    A failed verification ends this task in FAILURE, its line naming what follows.
    """
    started = time.monotonic()
    before = _read_step(job_id, step_key)
    outcome, dispatch = _run_verify(job_id, step_key)
    after = _read_step(job_id, step_key)
    result = verify_result(step_key, before, after, outcome)
    if outcome is Outcome.RETRY:
        _queue_next_attempt(self, job_id, step_key, after)
    _publish(self, job_id, dispatch)
    return _end(self, result, started, last=outcome is not Outcome.CONTINUE)


@shared_task(name=FINALIZE_TASK)
def finalize_task(job_id: str) -> str:
    """Close the job: final status and patch file."""
    db, settings = runtime()
    status = finalize_job(db, settings, job_id)
    return f"job {status}" if status else f"nothing to do: no job {job_id}"
