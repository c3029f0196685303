"""Step leases: the claim that lets exactly one worker act on a step at a time.

A step's lease is ``(lease_owner, lease_expires_at)``:

- ``QUEUED`` owner: a message for the step's current phase is on the broker. Any task
  for that phase may claim it. If it is still QUEUED when it expires, the recovery sweep
  enqueues the step again (a duplicate message is harmless: see ``claim``).
- a worker token: that worker is acting on the step and renews the lease every third of
  ``lease_seconds`` from a heartbeat thread. If it expires, the worker is presumed dead;
  the sweep counts a recovery and enqueues the step again. A sweep on the same machine
  does not wait for the expiry: it sees the token's process is gone (``process_gone``).

Claims and renewals are single conditional UPDATEs, so two workers never both win. So
are the writes a worker makes while it holds a step (``settle``, ``release_step``,
``hand_off``): each applies only while the worker's token still holds the lease.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from merlin_flow.errors import LeaseLost
from merlin_flow.store import Database, Phase, Step, utcnow

QUEUED = "queued"


_worker_name = ""
"""The name of the worker this process serves (its beat's name), once it is known."""


def set_worker_name(name: str) -> None:
    """Name the worker this process (and the pool processes it forks later) serves."""
    global _worker_name
    _worker_name = name


def _pid_space() -> str:
    """Which processes a pid names here: a hash of this boot and PID namespace ('' unknown).

    Two machines never share a boot id; two containers on one machine (same boot id,
    maybe the same host name) have their own PID namespaces.
    """
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return ""  # a /proc of another PID namespace: its pids are not ours
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return hashlib.sha256(f"{boot}/{namespace}".encode()).hexdigest()[:8]


HOST = f"{socket.gethostname().replace(':', '_')}/{_pid_space()}"
"""The first field of this process's lease tokens: host name and pid space."""


def new_token() -> str:
    """A unique owner token for one task execution: ``host/space:pid:random:worker``."""
    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}:{_worker_name}"


def token_process(token: str | None) -> str:
    """The process a lease token belongs to: its ``host:pid``."""
    return ":".join((token or "").split(":", 2)[:2])


def process_gone(token: str | None) -> bool:
    """True when ``token``'s process is known to have ended: it ran here, and is gone.

    "Here" is this machine and PID namespace (``HOST``); a token from elsewhere, or from
    before tokens named their pid space, is never known gone. A zombie (killed, not yet
    reaped) is gone. A pid used again by a new process looks alive: the lease's expiry
    then decides, as for a token from another machine.
    """
    host, _, rest = (token or "").partition(":")
    pid = rest.partition(":")[0]
    if host != HOST or HOST.endswith("/") or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)  # no signal sent: only whether the process exists
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False  # another user's process (alive), or no pid at all
    try:  # it exists: gone only if it is a zombie (a /proc that hides it: alive)
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :][:1] in ("Z", "X")


def token_tag(token: str) -> str:
    """The random part of a lease token, unique to one task execution."""
    parts = token.split(":", 3)
    return parts[2] if len(parts) > 2 else token


def token_worker(token: str | None) -> str:
    """The worker (its beat's name) a lease token belongs to; empty if it is not known."""
    parts = (token or "").split(":", 3)
    return parts[3] if len(parts) == 4 else ""


def claim(db: Database, step_id: int, phase: str, token: str, seconds: float) -> bool:
    """Take the step's lease for ``phase``; False if another worker holds it.

    A token that holds it already (the next try of a task, handed the lease by
    ``machinery.hand_over``) takes it again.
    """
    now = utcnow()
    with db.session() as session:
        result = session.execute(
            update(Step)
            .where(
                Step.id == step_id,
                Step.phase == phase,
                or_(
                    Step.lease_owner.is_(None),
                    Step.lease_owner == QUEUED,
                    Step.lease_owner == token,
                    Step.lease_expires_at < now,
                ),
            )
            .values(
                lease_owner=token,
                lease_expires_at=now + timedelta(seconds=seconds),
                deliveries=Step.deliveries + 1,
            )
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def renew(db: Database, step_id: int, token: str, seconds: float) -> bool:
    """Extend our lease; False if it is no longer ours."""
    with db.session() as session:
        result = session.execute(
            update(Step)
            .where(Step.id == step_id, Step.lease_owner == token)
            .values(lease_expires_at=utcnow() + timedelta(seconds=seconds))
            .execution_options(synchronize_session=False)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def queued_values(handoff_seconds: float) -> dict[str, object]:
    """Column values that hand a step over to the message now being queued for it."""
    return {
        "lease_owner": QUEUED,
        "lease_expires_at": utcnow() + timedelta(seconds=handoff_seconds),
    }


def settle(session: Session, step_id: int, token: str, **values: Any) -> None:
    """Write ``values`` to the step only while ``token`` holds its lease; LeaseLost otherwise.

    With no values it only checks (and row-locks) the lease for the transaction.
    """
    result = session.execute(
        update(Step)
        .where(Step.id == step_id, Step.lease_owner == token)
        .values(**(values or {"lease_owner": token}))
        .execution_options(synchronize_session=False)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(f"step {step_id}: lease taken over by another worker")


def release_step(session: Session, step_id: int, token: str) -> None:
    """The step's work is over (passed, failed, stopped): no phase left, no lease held."""
    settle(session, step_id, token, phase=Phase.DONE, lease_owner=None, lease_expires_at=None)


def hand_off(
    session: Session, step_id: int, token: str, phase: Phase, handoff_seconds: float, **values: Any
) -> None:
    """Queue the step for its next task (``phase``), for the next worker to claim."""
    settle(session, step_id, token, phase=phase, **values, **queued_values(handoff_seconds))


class Heartbeat:
    """Renews a lease from a background thread while a step is worked on."""

    def __init__(self, db: Database, step_id: int, token: str, seconds: float) -> None:
        """Prepare to renew ``token``'s lease on ``step_id`` every ``seconds / 3``."""
        self._db = db
        self._step_id = step_id
        self._token = token
        self._seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{step_id}", daemon=True)
        self._taken = False
        self._renewed_at = time.monotonic()

    @property
    def lost(self) -> bool:
        """True once another worker took the lease, or we could not renew it in time."""
        return self._taken or time.monotonic() - self._renewed_at > self._seconds

    def _run(self) -> None:
        while not self._stop.wait(self._seconds / 3):
            try:
                if not renew(self._db, self._step_id, self._token, self._seconds):
                    self._taken = True
                    return
                self._renewed_at = time.monotonic()
            except Exception:  # retried at the next beat; `lost` turns True if it keeps failing
                continue

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
