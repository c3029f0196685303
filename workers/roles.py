"""How a worker process starts: signal hooks for the real worker, and the embedded one.

``merlin worker`` runs Celery's own worker (``celery -A workers.app worker``): before the
pool forks, litellm is imported once; when the worker is ready, the recovery sweeper starts;
a warm shutdown (SIGTERM) waits for its running tasks ``merlin_shutdown_grace`` seconds at
most, then hands their steps back (``workers.shutdown``).
``merlin run`` and ``merlin demo`` use ``EmbeddedWorker``: the same tasks on a solo pool in a
thread of the calling process.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery
from celery.bootsteps import RUN
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down
from kombu import Exchange, Queue

from merlin_flow.engine.leases import set_worker_name
from merlin_flow.models.llm import preload
from workers.queues import ALL_QUEUES
from workers.shutdown import DEFAULT_GRACE, ShutdownBound
from workers.sweeper import Sweeper
from workers.tasks import runtime

_sweepers: list[Sweeper] = []
_bounds: list[ShutdownBound] = []
_controllers: list[Any] = []
"""The workers (``WorkController``) of ``merlin worker`` that became ready in this process."""


@worker_init.connect
def _preload(sender: Any = None, **_: Any) -> None:
    # Import litellm (seconds) once in the parent, before the pool forks; and name the
    # worker in its lease tokens, so that the recovery sweep can tell its beat.
    set_worker_name(str(getattr(sender, "hostname", "") or ""))
    preload()


@worker_ready.connect
def _start_sweeper(sender: Any = None, **_: Any) -> None:
    db, settings = runtime()
    queues = sorted(queue.name for queue in sender.task_consumer.queues) if sender else []
    sweeper = Sweeper(db, settings, getattr(sender, "hostname", "worker"), queues)
    sweeper.start()
    _sweepers.append(sweeper)
    _controllers.append(getattr(sender, "controller", None))
    from workers.canvas import enqueue_job

    grace = getattr(getattr(sender, "app", None), "conf", {}).get("merlin_shutdown_grace")
    pool: Any = getattr(sender, "pool", None)
    blueprint: Any = getattr(sender, "blueprint", None)
    bound = ShutdownBound(
        db,
        settings,
        DEFAULT_GRACE if grace is None else float(grace),
        enqueue_job,
        _stop_sweepers,
        kill=lambda pid: pool.terminate_job(pid, signal.SIGKILL),
        consuming=lambda: getattr(blueprint, "state", None) == RUN,
    )
    _bounds.append(bound)


@worker_shutting_down.connect
def _bound_the_shutdown(how: str = "", **_: Any) -> None:
    # Sent by Celery's signal handlers of `merlin worker` only (not the embedded worker's).
    if how == "Warm":
        for bound in _bounds:
            bound.signalled()


@worker_shutdown.connect
def _stop_sweepers(**_: Any) -> None:
    for sweeper in _sweepers:
        sweeper.stop()
    for sweeper in _sweepers:
        sweeper.join(timeout=5)  # it removes the worker's beat on its way out


def worker_exit_code() -> int | None:
    """The exit code of the ``merlin worker`` that ran here; None if none became ready."""
    if not _controllers:
        return None
    code = getattr(_controllers[-1], "exitcode", None)
    return code if isinstance(code, int) else 0


class EmbeddedWorker:
    """A Celery worker on a solo pool in a background thread of this process."""

    def __init__(self, app: Celery, queues: Sequence[str] = ALL_QUEUES) -> None:
        """Prepare a worker consuming ``queues``; ``start()`` runs it."""
        self.app = app
        self.queues = list(queues)
        self._worker: Any = None
        self._thread: threading.Thread | None = None
        self._sweeper: Sweeper | None = None

    def start(self) -> None:
        """Start consuming, and the recovery sweeper."""
        preload()
        hostname = f"embedded-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        set_worker_name(hostname)
        self._worker = self.app.WorkController(
            app=self.app,
            hostname=hostname,
            pool="solo",
            concurrency=1,
            queues=self.queues,
            loglevel="WARNING",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(
            target=self._worker.start, name="merlin-embedded", daemon=True
        )
        self._thread.start()
        db, settings = runtime()
        self._sweeper = Sweeper(db, settings, hostname, self.queues)
        self._sweeper.start()

    def stop(self) -> None:
        """Stop the sweeper and the worker (after its current task)."""
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper.join(timeout=5)
            self._sweeper = None
        if self._worker is not None:
            self._worker.stop(in_sighandler=False)
            self._worker = None
        if self._thread is not None:
            # The worker may be in a task of another job that shares the broker: let it
            # finish that task (a second Ctrl-C abandons it to the recovery sweep).
            self._thread.join()
            self._thread = None

    def abandon(self) -> None:
        """Stop the sweeper and leave the current task to die with this process.

        Its step's lease then lapses and another worker's recovery sweep takes it over.
        """
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper.join(timeout=5)
            self._sweeper = None
        self._worker = self._thread = None


def declare_queues(app: Celery, attempts: int = 5) -> None:
    """Declare merlin's queues on the broker before a worker consumes them.

    On the embedded broker, two workers started at once on a fresh ``MERLIN_HOME`` both
    insert the same queue rows; kombu takes the loser's IntegrityError as unrecoverable
    and the worker dies at start. Declared here first, with a retry, the race is lost
    harmlessly: the second declaration finds the rows.
    """
    for attempt in range(attempts):
        try:
            with app.connection_for_write() as connection:
                channel = connection.default_channel
                for name in ALL_QUEUES:
                    Queue(name, Exchange(name, type="direct"), routing_key=name)(channel).declare()
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def broker_report(app: Celery, timeout: float = 2.0) -> tuple[str | None, dict[str, int] | None]:
    """Whether the broker answers (None, or why not), and the workers consuming each queue.

    The embedded SQL broker has no remote control: the worker counts are None there.
    """
    try:
        with app.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
    except Exception as exc:  # kombu raises its own and the transport's errors
        return f"{type(exc).__name__}: {exc}", None
    if app.conf.broker_url.startswith("sqla+"):
        return None, None
    replies = app.control.inspect(timeout=timeout).active_queues() or {}
    counts = dict.fromkeys(ALL_QUEUES, 0)
    for queues in replies.values():
        for queue in queues:
            if queue.get("name") in counts:
                counts[queue["name"]] += 1
    return None, counts
