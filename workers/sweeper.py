"""The recovery sweeper thread every worker runs, plus the embedded broker's purge.

The same thread writes the worker's beat (``merlin_flow.presence``) before each sweep.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy import create_engine, inspect, text

from merlin_flow.presence import beat, leave
from merlin_flow.recovery import sweep
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from workers.canvas import enqueue_job

log = logging.getLogger(__name__)


def purge_delivered_messages(settings: Settings) -> int:
    """Delete rows the embedded broker has delivered (kombu never does); returns the count.

    A delivered row is never delivered again, even if its worker died, so dropping it
    loses nothing: recovery of lost work is the sweep's job.
    """
    if not settings.broker_is_embedded:
        return 0
    engine = create_engine(settings.broker.removeprefix("sqla+"))
    try:
        if "kombu_message" not in inspect(engine).get_table_names():
            return 0
        with engine.begin() as conn:
            result = conn.execute(text("DELETE FROM kombu_message WHERE visible = 0"))
            return int(result.rowcount or 0)
    finally:
        engine.dispose()


def run_sweep(db: Database, settings: Settings) -> list[str]:
    """One sweep: re-enqueue lost steps, purge delivered broker rows."""
    recovered = sweep(db, settings, lambda job_id, key: enqueue_job(db, job_id, key))
    if recovered:
        log.warning("recovery sweep re-enqueued jobs %s", ", ".join(recovered))
    purge_delivered_messages(settings)
    return recovered


class Sweeper(threading.Thread):
    """Beats for worker ``name`` and runs ``run_sweep``, now and every ``sweep_interval`` s."""

    def __init__(self, db: Database, settings: Settings, name: str, queues: list[str]) -> None:
        """Prepare the thread for the worker ``name`` consuming ``queues``; ``start()`` runs it."""
        super().__init__(name="merlin-sweeper", daemon=True)
        self._db = db
        self._settings = settings
        self._worker = name
        self._queues = queues
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Beat and sweep until stopped; a failure is logged and retried next interval."""
        while True:
            try:
                beat(self._db, self._worker, self._queues)
                run_sweep(self._db, self._settings)
            except Exception:
                log.exception("recovery sweep failed")
            if self._stop_event.wait(self._settings.sweep_interval):
                break
        try:
            leave(self._db, self._worker)
        except Exception:
            log.exception("could not remove the beat of %s", self._worker)

    def stop(self) -> None:
        """Ask the thread to finish after the current sweep (its beat is then removed)."""
        self._stop_event.set()
