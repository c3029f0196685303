"""A worker's warm shutdown (SIGTERM, a first Ctrl-C), bounded: its running steps handed back.

Celery's warm shutdown stops taking messages, then waits for the tasks that run to end.
A step's task is an agent's attempt: minutes of model calls and commands (a command
runs up to ``tool_command_timeout``, an exit command up to ``exit_command_timeout``), so
a worker told to stop ran on for as long: a step in a 40 s command kept it 42 s, the
main thread in ``Pool.join`` waiting for the pool process's result. ``ShutdownBound``
gives the running tasks ``grace`` seconds (``merlin worker --shutdown-grace``, default
``DEFAULT_GRACE``), then stops those still running, as a cold shutdown would, and hands
their steps back (``hand_back``): each lease the stopped processes held goes back to the
queue, as a new message's would (``QUEUED``), with a ``step_recovered`` event and no loss
counted against the step (a worker told to stop is not a worker lost: a step cut short
by many deploys is never taken for a poison step). Another worker claims it and resumes
the attempt in place, its paid model calls replayed from the journal, as after a crash.

- prefork: the pool processes running tasks are killed (SIGKILL; their commands die with
  them, by their guard) and, once they are gone, their steps are handed back and
  published. Celery's shutdown then ends as usual.
- threads, solo: the tasks run in the worker's own process, and a thread cannot be
  stopped. Its steps are handed back, its beat removed, and the process exits at once
  (its commands die by their guard). Nothing is published while its threads may still
  run: the recovery sweep publishes a queued step whose message is missing within a few
  seconds (``recovery.grace``).

A second SIGTERM (or Ctrl-C) during the grace ends it at once.

Once Celery's shutdown is over, ``exit_at_once`` ends the process without the
interpreter's finalization: its garbage collection of every module litellm loaded, and
the atexit joins of billiard's pool threads, took 2 to 5 s of a 2-core machine after each
shutdown, idle or not. Nothing is lost by it: the logs are flushed first, and what the
finalization would close the kernel closes (a command guard's socket, whose server then
stops what still runs; the database's and the broker's connections).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.process
import multiprocessing.util
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy import or_, select, update

from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.held_step import lock_job
from merlin_flow.engine.leases import HOST, new_token, queued_values
from merlin_flow.settings import Settings
from merlin_flow.store import FINAL_JOB_STATUSES, Database, Step, utcnow
from merlin_flow.store.events import EventKind, add_event

log = logging.getLogger(__name__)

DEFAULT_GRACE = 5.0
"""Seconds running tasks may go on after SIGTERM before they are stopped and handed back."""
GONE_SECONDS = 10.0
"""How long killed pool processes may take to be gone before their steps are handed back
all the same (their leases then go to the queue while the kernel finishes them)."""
CONSUMER_SECONDS = 10.0
"""How long the grace's end waits for Celery's consumer to stop taking messages."""
HOLD_SECONDS = 3 * GONE_SECONDS
"""The lease ``hold`` gives this process: the wait for the killed processes, and more. It
matters only if this process dies before ``hand_back``: the step's lease then lapses."""
POLL_SECONDS = 0.1
"""How often the grace looks whether the running tasks have ended."""
EXIT_HANDLERS_SECONDS = 2.0
"""How long ``exit_at_once`` lets the process's exit handlers run."""


def process_gone(pid: int) -> bool:
    """True once process ``pid`` has ended (a zombie, killed and not yet reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2 :][:1] in ("Z", "X")


def _held_by(pids: Collection[int]) -> Any:
    """The condition that a step's lease is held by a token of one of ``pids`` (here)."""
    return or_(*(Step.lease_owner.startswith(f"{HOST}:{pid}:", autoescape=True) for pid in pids))


def hold(db: Database, pids: Collection[int]) -> str:
    """Give the leases processes ``pids`` hold to a token of this process; return it.

    Before pool processes are killed: a sweep sees their process gone at once, and would
    take their steps over (counting a loss) before ``hand_back``; this process is alive.
    A killed process's writes, each made only while its token holds the lease, fail.
    The lease lasts ``HOLD_SECONDS``.
    """
    token = new_token()
    seconds = HOLD_SECONDS
    with db.session() as session:
        session.execute(
            update(Step)
            .where(_held_by(pids))
            .values(lease_owner=token, lease_expires_at=utcnow() + timedelta(seconds=seconds))
            .execution_options(synchronize_session=False)
        )
    return token


def hand_back(
    db: Database, settings: Settings, pids: Collection[int] = (), token: str | None = None
) -> list[tuple[str, str]]:
    """Queue again the steps whose leases processes ``pids`` of this machine hold.

    With ``token`` (``hold``'s), the steps that token holds instead. Returns ``(job id,
    step key)`` of each step handed back, to publish. Each lease goes to ``QUEUED`` only
    while it is still held so (a sweep may have taken it over first), under the job's
    lock; no loss is counted. A step whose job has ended meanwhile (cancelled) is
    released instead, and its job finalized.
    """
    if not pids and token is None:
        return []
    which = Step.lease_owner == token if token is not None else _held_by(pids)
    with db.reader() as session:
        held = session.execute(
            select(Step.id, Step.job_id, Step.key, Step.lease_owner).where(which)
        ).all()
    handed: list[tuple[str, str]] = []
    for step_id, job_id, key, owner in held:
        with db.session() as session:
            ended = lock_job(session, job_id).status in FINAL_JOB_STATUSES
            values = (
                {"lease_owner": None, "lease_expires_at": None}
                if ended
                else queued_values(settings.handoff_seconds)
            )
            result = session.execute(
                update(Step)
                .where(Step.id == step_id, Step.lease_owner == owner)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if not result.rowcount:  # type: ignore[attr-defined]
                continue
            if not ended:
                step = session.get_one(Step, step_id)
                add_event(
                    session,
                    job_id,
                    EventKind.STEP_RECOVERED,
                    f"step {key} handed back: its worker was told to stop while it ran",
                    key,
                    {"recoveries": step.recoveries, "losses": step.losses, "counted": False},
                )
        if ended:
            finalize_job(db, settings, job_id)
        else:
            handed.append((job_id, key))
    return handed


def running_processes() -> set[int]:
    """The processes running this worker's tasks now: pool processes, or its own."""
    from celery.worker import state

    for _ in range(3):
        with suppress(RuntimeError):  # the set changed while it was read: read it again
            return {r.worker_pid for r in list(state.active_requests) if r.worker_pid}
    return set()


class ShutdownBound:
    """The grace a warm shutdown gives running tasks, then their steps handed back."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        grace: float,
        publish: Callable[[Database, str, str], object],
        leave: Callable[[], None],
        kill: Callable[[int], object] = lambda pid: os.kill(pid, signal.SIGKILL),
        consuming: Callable[[], bool] = lambda: False,
        running: Callable[[], set[int]] = running_processes,
        exit_now: Callable[[int], Any] | None = None,
    ) -> None:
        """Bound a shutdown at ``grace`` s; ``publish(db, job, step)`` sends a step's chain.

        ``leave`` stops the sweeper (removing the worker's beat) before the process exits
        itself. ``kill(pid)`` kills a pool process: the pool's ``terminate_job``, so that
        Celery takes its task for terminated (acknowledged, revoked) at once, instead of
        waiting seconds for a result from a process that died. ``consuming()`` says
        whether Celery's consumer still takes messages. ``exit_now`` ends the process
        (``exit_at_once``). ``running`` and ``exit_now`` are what tests replace.
        """
        self._db = db
        self._settings = settings
        self._grace = grace
        self._publish = publish
        self._leave = leave
        self._kill = kill
        self._consuming = consuming
        self._running = running
        self._exit = exit_now or exit_at_once
        self._now = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = time.monotonic()
        self.handed: list[tuple[str, str]] = []
        """The steps this shutdown handed back."""

    def signalled(self) -> None:
        """A warm shutdown began: start the grace; a second signal ends it at once."""
        if self._thread is not None:
            self._now.set()
            return
        self._thread = threading.Thread(target=self.run, name="merlin-shutdown", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the grace and what follows it (tests)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """Wait for the running tasks, ``grace`` s at most; then stop them, hand them back.

        Pool processes are stopped only once the consumer has stopped taking messages
        (at its next loop, within about two seconds of the signal): one stopped earlier
        would free its slot for a new message, and a step handed back then would come
        back to this worker. Tasks of this process (threads, solo) are not waited for:
        the process exits.
        """
        self._began = time.monotonic()
        deadline = self._began + self._grace
        while self._running():
            if time.monotonic() >= deadline or self._now.wait(POLL_SECONDS):
                break
        deadline = time.monotonic() + CONSUMER_SECONDS
        while os.getpid() not in self._running() and self._consuming():  # a pool's
            if not self._running() or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        stopped: set[int] = set()
        while pids := self._running() - stopped:  # and any a reserved message started since
            try:
                self._stop(pids)
            except Exception:  # the database is down: the sweeps take the steps over later
                log.exception("warm shutdown: the running steps could not be handed back")
                if os.getpid() in pids:
                    self._exit(1)
                return
            stopped |= pids
            time.sleep(POLL_SECONDS)

    def _stop(self, pids: set[int]) -> None:
        own = os.getpid()
        log.warning(
            "warm shutdown: %d task(s) still running after %.1f s; stopping them and "
            "handing their steps back to the queue",
            len(pids), time.monotonic() - self._began,
        )  # fmt: skip
        if own in pids:  # threads, solo: the tasks run here
            self.handed += hand_back(self._db, self._settings, [own])
            self._say()
            self._leave()
            self._exit(0)
            return
        # First the leases go to this process, alive: no sweep takes a step of a killed
        # pool process over (counting a loss) before it is handed back.
        held = hold(self._db, pids)
        for pid in pids:
            with suppress(ProcessLookupError):
                self._kill(pid)
        deadline = time.monotonic() + GONE_SECONDS
        while not all(process_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        handed = hand_back(self._db, self._settings, token=held)
        self.handed += handed
        for job_id, key in handed:
            try:
                self._publish(self._db, job_id, key)
            except Exception as exc:  # the sweep publishes a queued step's missing message
                log.warning("warm shutdown: job %s step %s not published: %s", job_id, key, exc)
        self._say()

    def _say(self) -> None:
        steps = ", ".join(f"{job_id} {key}" for job_id, key in self.handed) or "none"
        log.warning("warm shutdown: steps handed back to the queue: %s", steps)


def exit_at_once(code: object = 0) -> NoReturn:
    """End this process now with ``code`` (``SystemExit``'s): its exit handlers, not its GC.

    The ``atexit`` handlers run, ``EXIT_HANDLERS_SECONDS`` at most (the command guard's
    server is stopped and waited for, as at any exit, so that nothing of the worker
    outlives it), but for multiprocessing's: it joins billiard's pool threads again, a
    second each, after Celery's shutdown joined them (its temporary folder is removed
    here instead). Then the logs are flushed.
    """
    pools = getattr(multiprocessing.util, "_exit_function", None)
    if pools is not None:
        atexit.unregister(pools)
    # What of multiprocessing's exit matters is kept: its temporary folder (pymp-...).
    folder = multiprocessing.process.current_process()._config.get("tempdir")  # type: ignore[attr-defined]
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    handlers = threading.Thread(target=atexit._run_exitfuncs, name="merlin-exit", daemon=True)
    handlers.start()
    handlers.join(EXIT_HANDLERS_SECONDS)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
