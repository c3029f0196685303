"""A step this worker holds: its lease claimed and renewed while a task works on it.

The step task (``merlin_flow.engine.attempt``) and the verify task
(``merlin_flow.engine.verdict``) both start from a ``HeldStep``: ``work`` claims the
step's lease for the task's phase, renews it from a heartbeat thread while the work runs,
and turns the faults that are not the step's own into the job's end. The rows they start
from are read with ``load_step``, and locked with ``lock_job``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from merlin_flow.config import MerlinConfig
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import fail_job
from merlin_flow.engine.leases import Heartbeat, claim, release_step, token_tag
from merlin_flow.engine.machinery import Trouble, classify
from merlin_flow.errors import ConfigError, LeaseLost, SandboxUnavailable, SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.store import FINAL_JOB_STATUSES, Database, Job, Phase, Step
from merlin_flow.store.events import EventKind, add_event
from merlin_flow.workspace.checkout import Checkout, open_checkout
from merlin_flow.workspace.environment import BuiltEnvironment
from merlin_flow.workspace.repository import JobRepository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldStep:
    """A step this worker holds the lease of (``token``), with what its work needs."""

    db: Database
    settings: Settings
    job_id: str
    step_key: str
    step_id: int
    token: str
    config: MerlinConfig
    base_commit: str
    """The job's base: the commit whose dependency files the user wrote."""

    @classmethod
    def of(cls, db: Database, settings: Settings, job: Job, step: Step, token: str) -> HeldStep:
        """The step ``step`` of ``job``, to be held with ``token``."""
        config = MerlinConfig.model_validate(job.config)
        return cls(db, settings, job.id, step.key, step.id, token, config, job.base_commit)

    def commit_subject(self, description: str) -> str:
        """A commit's first line: ``merlin(KEY):`` and the description's, cut to 72."""
        return f"merlin({self.step_key}): {description.splitlines()[0][:72].rstrip()}"

    def worktree(self, name: str) -> Path:
        """A worktree folder of this job, apart from any other worker's.

        The token keeps apart the worktrees of a worker that lost its lease and of the
        worker that took the step over: neither can delete the other's.
        """
        return self.settings.worktrees_dir / self.job_id / f"{name}-{token_tag(self.token)}"

    def work(self, phase: Phase, work: Callable[[Heartbeat], Outcome]) -> Outcome:
        """Claim the step for ``phase`` and ``work`` it while the lease is renewed.

        A lost lease stops the work (another worker has the step). A fault of the
        project's environment or of this machine, not of the step, fails the job once,
        with the reason, instead of every attempt failing the same way.
        """
        lease = self.config.limits.lease_seconds
        if not claim(self.db, self.step_id, phase, self.token, lease):
            return Outcome.STOP
        try:
            with Heartbeat(self.db, self.step_id, self.token, lease) as heartbeat:
                return work(heartbeat)
        except LeaseLost as exc:
            log.warning("%s", exc)
            return Outcome.STOP
        except (SetupFailed, SandboxUnavailable, ConfigError) as exc:
            if classify(exc) is Trouble.NO_SPACE:
                raise  # not the project's fault: the job waits for space (``machinery``)
            fail_job(self.db, self.settings, self.job_id, self.step_key, self.token, str(exc))
            return Outcome.STOP

    def release(self) -> None:
        """End the step's work in a transaction of its own (see ``leases.release_step``)."""
        with self.db.session() as session:
            release_step(session, self.step_id, self.token)

    @contextmanager
    def checkout(self, repository: JobRepository, commit: str, name: str) -> Iterator[Checkout]:
        """A checkout of ``commit`` in a worktree of this step's (``worktree(name)``).

        An environment built for it is recorded in the job's history; one built for
        dependency files a step changed (not the job's base commit's) has no network.
        """
        with open_checkout(
            self.settings,
            self.config,
            repository,
            commit,
            self.worktree(name),
            self._environment_built,
            self.job_ended,
            trusted=self.base_commit,
        ) as checkout:
            yield checkout

    def job_ended(self) -> bool:
        """True once the job has ended (cancelled...): asked while a command runs, to stop it.

        A database that cannot answer now does not stop the command: the next ask may.
        """
        try:
            if not job_has_ended(self.db, self.job_id):
                return False
            with self.db.session() as session:
                message = f"step {self.step_key}: its running command was stopped, the job ended"
                add_event(session, self.job_id, EventKind.COMMAND_STOPPED, message, self.step_key)
            return True
        except SQLAlchemyError as exc:
            log.warning("job %s: cannot tell whether it ended: %s", self.job_id, exc)
            return False

    def _environment_built(self, environment: BuiltEnvironment) -> None:
        with self.db.session() as session:
            add_event(
                session,
                self.job_id,
                EventKind.ENVIRONMENT_BUILT,
                f"environment {environment.path.name} built in {environment.seconds:.1f} s"
                + (f"; network: {environment.network}" if environment.network else ""),
                self.step_key,
                {"path": str(environment.path)},
            )


def load_step(session: Session, job_id: str, step_key: str) -> tuple[Job | None, Step | None]:
    """The job and its step ``step_key``; None for either that does not exist."""
    job = session.get(Job, job_id)
    if job is None:
        return None, None
    step = session.scalars(select(Step).where(Step.job_id == job_id, Step.key == step_key)).first()
    return job, step


def lock_job(session: Session, job_id: str) -> Job:
    """The job's row, locked for this transaction (on Postgres; SQLite serializes writers).

    Taken before any step row, as ``cancel_job`` does, so that two transactions never
    wait on each other in opposite orders.
    """
    return session.get_one(Job, job_id, with_for_update=True)


def job_has_ended(db: Database, job_id: str) -> bool:
    """True once the job has a final status (cancelled while its step was running...)."""
    with db.reader() as session:
        return session.scalar(select(Job.status).where(Job.id == job_id)) in FINAL_JOB_STATUSES
