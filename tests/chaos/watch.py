"""What the chaos driver watches around each kill, from ``/proc``, the database and the broker.

**Orphaned commands.** Every command a worker runs (the agent's ``run_command``, exit
commands) carries ``MERLIN_COMMAND_MARK`` in its environment (``merlin_flow.workspace.process``).
Just before a kill, ``command_processes`` lists the marked processes that descend from
the victim's process group (walking ``/proc/<pid>/stat`` parents), with everything they
started (in the sandbox: ``bwrap`` carries the mark, the command inside does not). A few
seconds after the kill, those still alive are orphans: commands that outlived their
worker. ``campaign_commands`` finds the ones left at the end (their environment or
working directory is under the campaign's folder).

**Idle after a kill.** ``held_steps`` lists, just before a kill, the steps the kill may
stall: the ones whose lease token (``host/space:pid:...``) is a process of the victim's
group (the token names the pid its own PID namespace gives it, ``NSpid``: with
``--namespaces`` not the pid this namespace sees; ``tests.chaos.namespaces``), and
queued steps whose message was delivered but not claimed (Redis: an entry in
``unacked``; the embedded broker: a ``kombu_message`` row with ``visible = 0``; on both,
a step queued more than ``PUBLISH_SECONDS`` ago whose message is in no queue: the
embedded broker's sweep deletes delivered rows; and a queued step whose message was in a
queue just before the kill and is not just after it). ``IdleWatch`` then polls their
rows and times each from the kill until its lease moves: another owner, a new expiry
(the sweep queued it again), or the step finished. A kill stalls no job longer than a
lease (across namespaces: a lease and a sweep) if the longest of those times is within
that bound.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from merlin_flow.engine.leases import QUEUED
from merlin_flow.workspace.command_guard import MARK_VARIABLE
from tests.chaos.namespaces import tokens_of_group

MARK = f"{MARK_VARIABLE}=".encode()
PROC = Path("/proc")
ORPHAN_SECONDS = 3.0
"""How long after a kill its commands must be gone."""
PUBLISH_SECONDS = 2.0
"""A step queued longer ago than this whose message is in no queue had it delivered."""
POLL_MARGIN = 2.0
"""Added to the workers' last sweeps at the end of a campaign: polling, a loaded machine."""

Key = tuple[int, int]
"""A process as ``(pid, start time)``: a pid used again later is another process."""


@dataclass(frozen=True)
class Proc:
    """One line of ``/proc/<pid>/stat``, the fields we need."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int

    @property
    def key(self) -> Key:
        """The process as ``(pid, start)``."""
        return self.pid, self.start


def stat(pid: int) -> Proc | None:
    """The process ``pid`` (None when it is gone)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return Proc(pid, int(rest[1]), int(rest[2]), rest[0], int(rest[19]))


def processes() -> dict[int, Proc]:
    """Every process now, by pid."""
    found = {}
    for name in os.listdir(PROC):
        if name.isdigit() and (proc := stat(int(name))) is not None:
            found[proc.pid] = proc
    return found


def _environ(pid: int) -> bytes:
    try:
        return (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return b""


def _marked(pid: int) -> bool:
    return any(entry.startswith(MARK) for entry in _environ(pid).split(b"\0"))


def _with_descendants(roots: Iterable[int], procs: dict[int, Proc]) -> set[Key]:
    """``roots`` and every process under them."""
    children: dict[int, list[int]] = defaultdict(list)
    for proc in procs.values():
        children[proc.ppid].append(proc.pid)
    found: set[Key] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in procs and procs[pid].key not in found:
            found.add(procs[pid].key)
            todo += children[pid]
    return found


def _under_group(pid: int, procs: dict[int, Proc], group: int) -> bool:
    """Whether an ancestor of ``pid`` is in process group ``group``."""
    seen: set[int] = set()
    proc = procs.get(pid)
    while proc is not None and proc.ppid > 1 and proc.pid not in seen:
        seen.add(proc.pid)
        proc = procs.get(proc.ppid)
        if proc is not None and proc.pgid == group:
            return True
    return False


def command_processes(group: int) -> set[Key]:
    """Processes of the commands that workers of process group ``group`` are running."""
    procs = processes()
    roots = [pid for pid in procs if _under_group(pid, procs, group) and _marked(pid)]
    return _with_descendants(roots, procs)


def campaign_commands(folder: Path) -> set[Key]:
    """Marked processes whose environment or working directory lies under ``folder``."""
    procs, mark = processes(), str(folder)
    roots = []
    for pid in procs:
        if pid == os.getpid() or not _marked(pid):
            continue
        with contextlib.suppress(OSError):
            if mark.encode() in _environ(pid) or os.readlink(PROC / str(pid) / "cwd").startswith(
                mark
            ):
                roots.append(pid)
                continue
    return _with_descendants(roots, procs)


def alive(keys: Iterable[Key]) -> set[Key]:
    """Those of ``keys`` still running (a zombie is dead)."""
    found = set()
    for pid, start in keys:
        proc = stat(pid)
        if proc is not None and proc.start == start and proc.state not in "ZX":
            found.add((pid, start))
    return found


def describe(keys: Iterable[Key]) -> list[str]:
    """``pid command line`` of each process, for the report."""
    lines = []
    for pid, _ in sorted(keys):
        try:
            line = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            line = "(gone)"
        lines.append(f"{pid} {line[:160]}")
    return lines


@dataclass(frozen=True)
class Held:
    """A step as it was just before a kill that may stall it."""

    step_id: int
    job_id: str
    key: str
    owner: str
    expires: datetime | None
    delivered: bool
    """Queued, its message delivered but not claimed (else: run by the victim)."""


def held_steps(
    db: Any, group: int | Collection[int], broker: Broker, handoff: float
) -> tuple[list[Held], list[Held]]:
    """The steps a kill of process group ``group`` (or of several groups at once: a
    machine's crash) may stall (see the module docstring), and the queued steps whose
    message waits in a queue (``taken`` tells, after the kill, which of those were taken
    off their queue in between, maybe by the victim)."""
    from sqlalchemy import select

    from merlin_flow.store import Job, Step, utcnow

    waiting, delivered = broker.messages()  # before the rows: see the module docstring
    groups = {group} if isinstance(group, int) else set(group)
    members = tokens_of_group([p.pid for p in processes().values() if p.pgid in groups])
    published_before = utcnow() - timedelta(seconds=PUBLISH_SECONDS)
    held, queued = [], []
    with db.reader() as session:
        rows = session.execute(
            select(Step.id, Job.id, Step.key, Step.lease_owner, Step.lease_expires_at)
            .join(Job, Step.job_id == Job.id)
            .where(Step.lease_owner.is_not(None))
        ).all()
    for step_id, job_id, key, owner, expires in rows:
        if owner == QUEUED:
            if expires is None:
                continue
            if (job_id, key) in waiting:
                queued.append(Held(step_id, job_id, key, owner, expires, True))
                continue
            queued_at = expires.replace(tzinfo=None) - timedelta(seconds=handoff)
            if (job_id, key) in delivered or queued_at < published_before:
                held.append(Held(step_id, job_id, key, owner, expires, True))
            continue
        if not _of_group(owner, groups, members):
            continue
        held.append(Held(step_id, job_id, key, owner, expires, False))
    return held, queued


def _of_group(token: str, groups: set[int], members: set[tuple[str, int]]) -> bool:
    """Whether lease ``token`` (``host/space:pid:...``) names a process of ``groups``,
    whose processes are ``members`` (``(pid space, pid in its namespace)``). A token with
    no pid space names a pid of ours."""
    host, _, rest = token.partition(":")
    space, pid = host.rpartition("/")[2], rest.partition(":")[0]
    if not pid.isdigit():
        return False
    if space:
        return (space, int(pid)) in members
    try:
        return os.getpgid(int(pid)) in groups
    except OSError:
        return False


def taken(queued: list[Held], broker: Broker) -> list[Held]:
    """Those of ``queued`` whose message is no longer in a queue (read after the kill)."""
    waiting, _ = broker.messages()
    return [held for held in queued if (held.job_id, held.key) not in waiting]


@dataclass
class Broker:
    """Reads which step messages wait in a queue and which were delivered, not acked."""

    redis_url: str | None = None
    embedded: Path | None = None
    """The embedded broker's SQLite file."""

    def messages(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """``(waiting, delivered)``: ``(job id, step key)`` of the messages in each state."""
        with contextlib.suppress(Exception):
            if self.redis_url is not None:
                return self._redis()
            if self.embedded is not None:
                return self._embedded()
        return set(), set()

    def _redis(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        import redis

        from workers.queues import ALL_QUEUES
        from workers.sweeper import REDIS_PRIORITIES, _step_of

        assert self.redis_url is not None
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            waiting = set()
            for queue in ALL_QUEUES:
                for priority in REDIS_PRIORITIES:
                    name = f"{queue}\x06\x16{priority}" if priority else queue
                    waiting |= {_step_of(raw) or ("", "") for raw in client.lrange(name, 0, -1)}
            delivered = {
                _step_of(json.loads(raw)[0]) or ("", "") for raw in client.hvals("unacked")
            }
            return waiting, delivered
        finally:
            client.close()

    def _embedded(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        from workers.sweeper import _step_of

        assert self.embedded is not None
        if not self.embedded.exists():
            return set(), set()
        found: dict[int, set[tuple[str, str]]] = {0: set(), 1: set()}
        with (
            contextlib.closing(sqlite3.connect(self.embedded, timeout=5)) as conn,
            contextlib.suppress(sqlite3.OperationalError),  # no table yet
        ):
            for payload, visible in conn.execute("SELECT payload, visible FROM kombu_message"):
                found[int(bool(visible))].add(_step_of(payload) or ("", ""))
        return found[1], found[0]


@dataclass
class Stall:
    """One kill's stalled steps and how long each sat after it."""

    kill: int
    """The kill's number (from 0)."""
    at: float
    """``time.time()`` of the kill (wall time: the database's times are compared to it)."""
    held: list[Held]
    waits: dict[int, float] = field(default_factory=dict)
    """Step id: seconds from the kill until its lease moved."""


class IdleWatch:
    """Times, for each kill, how long its stalled steps sat before their lease moved."""

    def __init__(self, lease: float, handoff: float) -> None:
        self.stalls: list[Stall] = []
        self.sweeps: list[float] = []
        """``time.time()`` of each sweep seen: the workers' beats, as the database has them."""
        self._beats: dict[str, datetime] = {}
        self.lease, self.handoff = lease, handoff

    def add(self, stall: Stall) -> None:
        """Watch the steps of one more kill."""
        self.stalls.append(stall)

    def pending(self) -> list[tuple[Stall, Held]]:
        """Steps whose lease has not moved since their kill."""
        return [(s, h) for s in self.stalls for h in s.held if h.step_id not in s.waits]

    def poll(self, db: Any, broker: Broker | None = None) -> None:
        """Read the workers' beats and the pending steps' rows once; time those whose lease
        moved, and those taken for delivered whose message is (back) in a queue: they wait
        their turn behind other jobs, and the sweep rightly leaves them (an ``unacked``
        entry may be a stale one, of an earlier message a killed worker took)."""
        from sqlalchemy import select

        from merlin_flow.store import FINISHED_STEP_STATUSES, Step, WorkerBeat

        with db.reader() as session:
            beats = dict(session.execute(select(WorkerBeat.name, WorkerBeat.last_seen)).all())
        self.sweeps += sorted(
            _epoch(seen) for name, seen in beats.items() if self._beats.get(name) != seen
        )
        self._beats = beats
        pending = self.pending()
        if not pending:
            return
        ids = {held.step_id for _, held in pending}
        with db.reader() as session:
            rows = {
                row[0]: row[1:]
                for row in session.execute(
                    select(
                        Step.id,
                        Step.lease_owner,
                        Step.lease_expires_at,
                        Step.status,
                        Step.finished_at,
                    ).where(Step.id.in_(ids))
                ).all()
            }
        waiting: set[tuple[str, str]] = set()
        if broker is not None and any(held.delivered for _, held in pending):
            waiting = broker.messages()[0]
        now = time.time()
        for stall, held in pending:
            owner, expires, status, finished = rows.get(held.step_id, (None,) * 4)
            moved = (owner, expires) != (held.owner, held.expires)
            queued = held.delivered and (held.job_id, held.key) in waiting
            if status in FINISHED_STEP_STATUSES or moved or queued:
                # When it moved, as the row says (this poll may come late: the driver was
                # busy killing or cutting), but never later than now.
                when = now
                if status in FINISHED_STEP_STATUSES and finished is not None:
                    when = min(when, _epoch(finished))
                elif moved and expires is not None:
                    since = self.handoff if owner == QUEUED else self.lease
                    when = min(when, _epoch(expires) - since)
                stall.waits[held.step_id] = max(0.0, when - stall.at)

    def close(self) -> None:
        """Time every step that never moved until now (each a violation if over the bound)."""
        now = time.time()
        for stall, held in self.pending():
            stall.waits[held.step_id] = now - stall.at

    def longest(self) -> tuple[float, str]:
        """The longest wait, and which step of which kill it was ("" when none)."""
        worst, what = 0.0, ""
        for stall in self.stalls:
            for held in stall.held:
                wait = stall.waits.get(held.step_id, 0.0)
                if wait > worst:
                    kind = "delivered message" if held.delivered else "running"
                    worst, what = wait, f"kill {stall.kill}: {held.job_id}/{held.key} ({kind})"
        return worst, what

    def takeovers(self) -> tuple[list[float], list[float]]:
        """The waits of the running steps timed after kills: of those whose lease moved
        before it would have lapsed (a sweep of the victim's pid space saw its process
        gone), and of those whose lease moved only after it lapsed (the only way across
        machines)."""
        early: list[float] = []
        late: list[float] = []
        for stall in self.stalls:
            for held in stall.held:
                if held.delivered or held.expires is None or held.step_id not in stall.waits:
                    continue
                wait = stall.waits[held.step_id]
                (early if stall.at + wait < _epoch(held.expires) else late).append(wait)
        return early, late

    def over(self, bound: float) -> list[str]:
        """A line for each step that sat longer than ``bound`` after a kill, with the
        longest time no worker swept in that while (no live worker ready: all starting)."""
        lines = []
        for stall in self.stalls:
            for held in stall.held:
                wait = stall.waits.get(held.step_id, 0.0)
                if wait > bound:
                    what = "its message delivered, not claimed" if held.delivered else "running"
                    lines.append(
                        f"{held.job_id}/{held.key} sat {wait:.1f} s after kill {stall.kill} "
                        f"(bound {bound:g} s; {what}; longest time without a sweep in it: "
                        f"{self.unswept(stall.at, stall.at + wait):.1f} s)"
                    )
        return lines

    def unswept(self, begin: float, end: float) -> float:
        """The longest time between ``begin`` and ``end`` in which no sweep was seen."""
        times = [begin, *sorted(t for t in self.sweeps if begin < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))

    def longest_unswept(self) -> float:
        """The longest time in the campaign in which no worker swept (as polled)."""
        if not self.sweeps:
            return 0.0
        return self.unswept(min(self.sweeps), max(self.sweeps))


def _epoch(when: datetime) -> float:
    """A database time (naive UTC, as merlin writes them) as ``time.time()`` seconds."""
    return when.replace(tzinfo=UTC).timestamp()
