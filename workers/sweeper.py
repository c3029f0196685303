"""The recovery sweeper thread every worker runs, plus the embedded broker's purge."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import create_engine, inspect, text

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
    recovered = sweep(db, settings, lambda job_id: enqueue_job(db, job_id))
    if recovered:
        log.warning("recovery sweep re-enqueued jobs %s", ", ".join(recovered))
    purge_delivered_messages(settings)
    return recovered


class Sweeper(threading.Thread):
    """Runs ``run_sweep`` now and then every ``settings.sweep_interval`` seconds."""

    def __init__(self, db: Database, settings: Settings) -> None:
        """Prepare the thread; call ``start()`` to run it."""
        super().__init__(name="merlin-sweeper", daemon=True)
        self._db = db
        self._settings = settings
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Sweep until stopped; a failed sweep is logged and retried next interval."""
        while True:
            try:
                run_sweep(self._db, self._settings)
            except Exception:
                log.exception("recovery sweep failed")
            if self._stop_event.wait(self._settings.sweep_interval):
                return

    def stop(self) -> None:
        """Ask the thread to finish after the current sweep."""
        self._stop_event.set()
