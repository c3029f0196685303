"""The recovery sweeper thread every worker runs, plus the embedded broker's purge.

The same thread writes the worker's beat (``merlin_flow.engine.presence``) before each sweep,
and reads which step messages the broker holds (``broker_messages``), so that the sweep
notices a queued step whose message was lost within seconds (``merlin_flow.engine.recovery``).
Each sweep also removes what this machine's workers left in its ``MERLIN_HOME`` for
jobs that have ended (``merlin_flow.workspace.worktree_cleanup``), whichever machine ended them,
and the checkouts of environment builds whose worker was killed. Jobs parked for want
of space (``merlin_flow.engine.machinery``) are resumed once there is space again.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, create_engine, inspect, text

from merlin_flow.engine.machinery import space_is_back, waiting_for_space
from merlin_flow.engine.presence import beat, leave
from merlin_flow.engine.recovery import Messages, grace, sweep
from merlin_flow.errors import InputError
from merlin_flow.jobs.control import resume_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, utcnow
from merlin_flow.store.fork_gate import SQLITE_CONNECT_ARGS
from merlin_flow.workspace.worktree_cleanup import clear_ended, clear_setups
from workers.canvas import enqueue_job
from workers.queues import ALL_QUEUES, STEP_TASK, VERIFY_TASK

log = logging.getLogger(__name__)


def _broker_engine(settings: Settings) -> Engine:
    """An engine on the embedded broker's SQLite file, its connections gated for forks."""
    return create_engine(settings.broker.removeprefix("sqla+"), connect_args=SQLITE_CONNECT_ARGS)


def purge_delivered_messages(settings: Settings) -> int:
    """Delete rows the embedded broker has delivered (kombu never does); returns the count.

    A delivered row is never delivered again, even if its worker died, so dropping it
    loses nothing: recovery of lost work is the sweep's job.
    """
    if not settings.broker_is_embedded:
        return 0
    engine = _broker_engine(settings)
    try:
        if "kombu_message" not in inspect(engine).get_table_names():
            return 0
        with engine.begin() as conn:
            result = conn.execute(text("DELETE FROM kombu_message WHERE visible = 0"))
            return int(result.rowcount or 0)
    finally:
        engine.dispose()


REDIS_PRIORITIES = (0, 3, 6, 9)
"""kombu's Redis priority steps: a queue's messages of priority p > 0 are in ``queue\x06\x16p``."""


def _step_of(payload: Any) -> tuple[str, str] | None:
    """``(job id, step key)`` of a step or verify message (kombu's JSON envelope), else None."""
    try:
        if isinstance(payload, (bytes, str)):
            payload = json.loads(payload)
        if payload["headers"].get("task") not in (STEP_TASK, VERIFY_TASK):
            return None
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]), str(args[1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _redis_messages(settings: Settings) -> Messages:
    """Step messages in Redis's queues, or delivered (unacked) less than ``grace`` ago.

    A message delivered longer ago whose step is still queued went to a worker that
    died before it claimed the step (it would stay unacked for the visibility timeout).
    """
    import redis

    client = redis.Redis.from_url(settings.broker, socket_timeout=5, socket_connect_timeout=5)
    try:
        found: Messages = set()
        for queue in ALL_QUEUES:
            for priority in REDIS_PRIORITIES:
                key = f"{queue}\x06\x16{priority}" if priority else queue
                for raw in client.lrange(key, 0, -1):
                    found.add(_step_of(raw) or ("", ""))
        since = time.time() - grace(settings)
        tags: list[Any] = list(client.zrangebyscore("unacked_index", since, "+inf"))
        for delivered in client.hmget("unacked", tags) if tags else []:
            if delivered is not None:  # [message, exchange, routing key]
                found.add(_step_of(json.loads(delivered)[0]) or ("", ""))
        return found
    finally:
        client.close()


def _embedded_messages(settings: Settings) -> Messages:
    """Step messages the embedded broker has not delivered yet."""
    engine = _broker_engine(settings)
    try:
        if "kombu_message" not in inspect(engine).get_table_names():
            return set()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT payload FROM kombu_message WHERE visible = 1"))
            return {_step_of(row[0]) or ("", "") for row in rows}
    finally:
        engine.dispose()


def broker_messages(settings: Settings) -> Messages | None:
    """The steps whose message is waiting on the broker; None if the broker cannot tell."""
    try:
        if settings.broker_is_embedded:
            return _embedded_messages(settings)
        if settings.broker.startswith(("redis://", "rediss://")):
            return _redis_messages(settings)
    except Exception:
        log.warning("recovery sweep: the broker's messages could not be read", exc_info=True)
    return None


def run_sweep(db: Database, settings: Settings, watched_since: datetime | None = None) -> list[str]:
    """One sweep: re-enqueue lost steps, purge delivered rows, clear ended jobs' worktrees.

    Lost steps are those of lost workers and lost messages (``watched_since``: when this
    sweeper started reading the broker); the worktrees are this machine's
    (``merlin_flow.workspace.worktree_cleanup``). A failure of the last is only logged.
    """
    recovered = sweep(
        db,
        settings,
        lambda job_id, key: enqueue_job(db, job_id, key),
        lambda: broker_messages(settings),
        watched_since,
    )
    if recovered:
        log.warning("recovery sweep re-enqueued jobs %s", ", ".join(recovered))
    purge_delivered_messages(settings)
    try:
        resume_waiting_for_space(db, settings)
    except Exception:
        log.warning("the jobs parked for space could not be looked at", exc_info=True)
    try:
        clear_ended(db, settings)
    except Exception:
        log.warning("the worktrees of ended jobs could not be looked at", exc_info=True)
    try:
        clear_setups(settings)
    except Exception:
        log.warning("the setup checkouts could not be looked at", exc_info=True)
    return recovered


def resume_waiting_for_space(db: Database, settings: Settings) -> list[str]:
    """Resume (and enqueue) the jobs parked for want of space, once there is space here.

    Every sweeper may try: the first takes the job (``resume_job`` locks it), the others
    find it no longer parked.
    """
    waiting = waiting_for_space(db)
    if not waiting or not space_is_back(settings):
        return []
    resumed = []
    for job_id in waiting:
        try:
            resume_job(db, settings, job_id, check_tiers=False)
        except InputError as exc:  # resumed by another sweeper, or its branch moved
            log.info("job %s not resumed: %s", job_id, exc)
            continue
        enqueue_job(db, job_id)
        resumed.append(job_id)
    if resumed:
        log.warning("space is back: resumed jobs %s", ", ".join(resumed))
    return resumed


RETRY_SECONDS = 0.5
"""After a failed sweep (an outage cut its connection), the next one starts this soon."""


class Sweeper(threading.Thread):
    """Beats for worker ``name`` and runs ``run_sweep``, now and every ``sweep_interval`` s.

    After a sweep that failed, the next starts ``RETRY_SECONDS`` later.
    """

    def __init__(self, db: Database, settings: Settings, name: str, queues: list[str]) -> None:
        """Prepare the thread for the worker ``name`` consuming ``queues``; ``start()`` runs it."""
        super().__init__(name="merlin-sweeper", daemon=True)
        self._db = db
        self._settings = settings
        self._worker = name
        self._queues = queues
        self._stop_event = threading.Event()
        self._since = utcnow()
        """When this sweeper began to watch the broker (the grace of a lost message)."""

    def run(self) -> None:
        """Beat and sweep until stopped; a failure is logged and retried next interval."""
        while True:
            interval = self._settings.sweep_interval
            try:
                beat(self._db, self._worker, self._queues)
                run_sweep(self._db, self._settings, self._since)
            except Exception:  # a connection cut mid-sweep, mostly: try again soon
                log.exception("recovery sweep failed")
                interval = min(interval, RETRY_SECONDS)
            if self._stop_event.wait(interval):
                break
        try:
            leave(self._db, self._worker)
        except Exception:
            log.exception("could not remove the beat of %s", self._worker)

    def stop(self) -> None:
        """Ask the thread to finish after the current sweep (its beat is then removed)."""
        self._stop_event.set()
