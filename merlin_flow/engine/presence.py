"""Which workers are alive, so that nothing waits in silence for a worker that is not there.

Every worker (``merlin worker``, and the one ``merlin run`` starts) writes a beat row at
each recovery sweep, and deletes it when it stops. A worker whose last beat is older
than three sweep intervals (at least 30 s) is taken for gone: it was killed, or its
machine was. This works on every broker, the embedded one included, because workers
and submitters share the database anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select

from merlin_flow.settings import Settings
from merlin_flow.store import Database, WorkerBeat, utcnow

MIN_SILENCE_SECONDS = 30.0
"""A worker silent for less than this is alive, whatever the sweep interval."""


@dataclass(frozen=True)
class WorkerSeen:
    """A worker's last beat."""

    name: str
    queues: tuple[str, ...]
    last_seen: datetime


def beat(db: Database, name: str, queues: list[str]) -> None:
    """Record that worker ``name``, consuming ``queues``, is alive now."""
    with db.session() as session:
        row = session.get(WorkerBeat, name)
        if row is None:
            session.add(WorkerBeat(name=name, queues=",".join(queues)))
        else:
            row.last_seen = utcnow()


def leave(db: Database, name: str) -> None:
    """Forget worker ``name``: it is stopping."""
    with db.session() as session:
        session.execute(delete(WorkerBeat).where(WorkerBeat.name == name))


def silence_limit(settings: Settings) -> timedelta:
    """How long a worker may go without a beat before it is taken for gone."""
    return timedelta(seconds=max(3 * settings.sweep_interval, MIN_SILENCE_SECONDS))


def live_workers(db: Database, settings: Settings) -> list[WorkerSeen]:
    """The workers that beat recently, newest beat first."""
    since = utcnow() - silence_limit(settings)
    with db.reader() as session:
        rows = session.scalars(
            select(WorkerBeat)
            .where(WorkerBeat.last_seen >= since)
            .order_by(WorkerBeat.last_seen.desc())
        ).all()
        return [WorkerSeen(r.name, tuple(r.queues.split(",")), r.last_seen) for r in rows]


def missing_queues(db: Database, settings: Settings, queues: tuple[str, ...]) -> list[str]:
    """Those of ``queues`` no live worker consumes."""
    served = {queue for worker in live_workers(db, settings) for queue in worker.queues}
    return [queue for queue in queues if queue not in served]


def no_worker_notice(db: Database, settings: Settings, queues: tuple[str, ...]) -> str | None:
    """What to tell a user whose job needs ``queues`` when no live worker serves them."""
    missing = missing_queues(db, settings, queues)
    if not missing:
        return None
    seconds = int(silence_limit(settings).total_seconds())
    which = "any of merlin's queues" if missing == list(queues) else "queue " + ", ".join(missing)
    return (
        f"no worker has served {which} in the last {seconds} s: the job waits until one "
        "starts (`merlin worker`, on this database and broker)"
    )
