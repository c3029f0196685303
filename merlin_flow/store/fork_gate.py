"""SQLite connections that a fork never catches inside SQLite or inside a transaction.

A process that forks while another of its threads is inside SQLite gives the child
SQLite's process-wide mutexes locked, and no thread of the child will ever unlock them:
the child's first query waits forever. A fork while one of its connections holds a
transaction gives the child SQLite's record of that lock (kept per file, for the whole
process), held by nobody there: the child's own connections wait on it, then fail with
"database is locked". A Celery prefork worker forks a new pool process each time one
ends (killed, or terminated when the broker connection is lost, as happens in bursts on
a full disk) while its own threads, the consumer polling the embedded broker and the
recovery sweeper, use SQLite all the time. The new pool process then hangs with the task
it was given; once every pool process has, the worker takes no more work.

Every SQLite connection merlin opens (its store, the embedded broker, the sweeper's reads
of the broker) is a ``GatedConnection``: each call into SQLite passes one ``Gate``, which
also counts, per thread, the locks held between calls (a connection's open transaction,
a cursor's statement with rows left). A fork (``os.register_at_fork``) closes the gate,
waits until no call is inside and no other thread holds a lock, forks, then opens it; the
child starts with a new gate. While it waits, a thread holding no lock waits at the gate
too; a thread holding one goes in, on any of its connections, so that it can release it.
The wait is bounded by ``FORK_WAIT_SECONDS``: past it (a thread keeping a transaction open
for long), the fork goes ahead as it would without the gate. A lock the forking thread
holds itself is not waited for.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Union

FORK_WAIT_SECONDS = 2.0
"""How long a fork waits for calls and transactions to end. Shorter than any busy timeout:
a thread made to wait while it holds a lock (through another connection) can hold up a
call inside that waits for the lock, until the fork gives up."""


class Gate:
    """The calls inside SQLite and the locks held between calls; a fork waits for both."""

    def __init__(self) -> None:
        """An open gate, nobody inside, no lock held."""
        # Reentrant: the collector may close a connection (through the gate) in a thread
        # that is in the middle of going in or out.
        self._changed = threading.Condition(threading.RLock())
        self._inside: dict[int, int] = {}
        """Per thread, its calls inside SQLite (more than one: the collector's, nested)."""
        self._held: dict[int, int] = {}
        """Per thread, the transactions and statements it holds open between calls."""
        self._forker: int | None = None

    def enter(self, holding: bool) -> None:
        """Go inside; while a fork waits, first wait for it, unless a lock is held.

        ``holding``: the call's connection or cursor holds a lock. A thread holding one
        on any connection goes in too (only its going on releases it), and so does a
        call nested in one of its thread's (the collector closing a connection).
        """
        me = threading.get_ident()
        with self._changed:
            while (
                not holding
                and me not in self._held
                and me not in self._inside
                and self._forker not in (None, me)
            ):
                self._changed.wait()
            self._inside[me] = self._inside.get(me, 0) + 1

    def leave(self, now: Sequence[tuple[Counted, bool | None]] = ()) -> None:
        """Come out; each object of ``now`` holds a lock from here on, or does not.

        None: ask the connection (whether its transaction is open), under the gate's
        lock, so that of two threads sharing it the last to leave reads the last state.
        """
        me = threading.get_ident()
        with self._changed:
            _decrement(self._inside, me)
            for held, holds in now:
                self._recount(held, _in_transaction(held) if holds is None else holds)
            if self._forker is not None and self.idle:
                self._changed.notify_all()

    def forget(self, *gone: Counted) -> None:
        """Count no lock for ``gone`` any more (closed, or closed by the collector).

        A connection's cursors go with it: its close ended their statements.
        """
        with self._changed:
            for held in gone:
                self._recount(held, False)
                for cursor in list(getattr(held, "cursors", ())):
                    self._recount(cursor, False)
            if self._forker is not None and self.idle:
                self._changed.notify_all()

    def counts(self, held: Counted) -> bool:
        """Whether this gate counts a lock held by ``held``."""
        counted = held.counted_by
        return counted is not None and counted[0] is self

    def _recount(self, held: Counted, holds: bool) -> None:
        # From the object's own record, under the lock: a nested call (the collector's,
        # or another thread's on a shared connection) may have counted it already.
        counted = held.counted_by if self.counts(held) else None
        if holds and counted is None:
            me = threading.get_ident()
            held.counted_by = (self, me)
            self._held[me] = self._held.get(me, 0) + 1
            if isinstance(held, GatedCursor):
                held.connection.cursors.add(held)
        elif counted is not None and not holds:
            held.counted_by = None
            _decrement(self._held, counted[1])
            if isinstance(held, GatedCursor):
                held.connection.cursors.discard(held)

    @property
    def idle(self) -> bool:
        """Whether no call is inside SQLite and no thread but the forking one holds a lock.

        A lock the forking thread holds is not waited for: only it could release it.
        """
        return not self._inside and all(thread == self._forker for thread in self._held)

    def close(self, timeout: float) -> bool:
        """Wait until idle, then keep the gate's lock until ``open``.

        False if ``timeout`` passed first (the lock is kept all the same). A second
        thread forking meanwhile waits for the first fork to be done.
        """
        self._changed.acquire()
        while self._forker is not None:
            self._changed.wait()
        self._forker = threading.get_ident()
        return self._changed.wait_for(lambda: self.idle, timeout)

    def open(self) -> None:
        """After the fork, in the parent: let everyone in again."""
        self._forker = None
        self._changed.notify_all()
        self._changed.release()


def _decrement(counts: dict[int, int], thread: int) -> None:
    left = counts.get(thread, 0) - 1
    if left > 0:
        counts[thread] = left
    else:
        counts.pop(thread, None)


def _in_transaction(held: Counted) -> bool:
    try:
        return bool(held.in_transaction)  # type: ignore[union-attr]
    except sqlite3.ProgrammingError:  # closed, or another thread's
        return False


_gate = Gate()
Counted = Union["GatedConnection", "GatedCursor"]
"""What can hold a lock between calls: a connection's transaction, a cursor's statement."""


def gate() -> Gate:
    """The gate of this process (a forked child has a new one)."""
    return _gate


def _before_fork() -> None:
    _gate.close(FORK_WAIT_SECONDS)


def _after_fork_in_parent() -> None:
    _gate.open()


def _after_fork_in_child() -> None:
    # Only the forking thread is left, and the parent's gate is locked by it.
    global _gate
    _gate = Gate()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


class _Call:
    """One call into SQLite through the gate (``with _Call(connection, cursor) as call:``).

    Afterwards it counts or uncounts the connection's transaction and the cursor's
    statement: a statement with rows left to fetch holds a read lock as a transaction
    does. A cursor method sets ``call.active`` to say whether its statement is left so.
    """

    __slots__ = ("active", "connection", "cursor", "gate")

    def __init__(self, connection: GatedConnection, cursor: GatedCursor | None = None) -> None:
        self.connection = connection
        self.cursor = cursor

    def __enter__(self) -> _Call:
        self.gate = here = _gate
        self.active = self.cursor is not None and here.counts(self.cursor)
        here.enter(holding=self.active or here.counts(self.connection))
        return self

    def __exit__(self, *_: object) -> None:
        now: list[tuple[Counted, bool | None]] = [(self.connection, None)]
        if self.cursor is not None:
            now.append((self.cursor, self.active))
        self.gate.leave(now)


class GatedCursor(sqlite3.Cursor):
    """A cursor whose statements and fetches pass the gate."""

    connection: GatedConnection
    counted_by: tuple[Gate, int] | None = None
    """The gate counting this cursor's statement (and the thread holding it), while it may
    have rows left."""

    def execute(self, *args: Any) -> GatedCursor:
        """Run one statement (``sqlite3.Cursor.execute``)."""
        with _Call(self.connection, self) as call:
            super().execute(*args)
            call.active = self.description is not None  # rows to fetch, maybe
        return self

    def executemany(self, *args: Any) -> GatedCursor:
        """Run one statement for each set of parameters."""
        with _Call(self.connection, self) as call:
            super().executemany(*args)
            call.active = self.description is not None
        return self

    def executescript(self, *args: Any) -> GatedCursor:
        """Run a script of statements."""
        with _Call(self.connection, self) as call:
            super().executescript(*args)
            call.active = False
        return self

    def fetchone(self) -> Any:
        """The next row, or None."""
        with _Call(self.connection, self) as call:
            row = super().fetchone()
            call.active = row is not None
            return row

    def fetchmany(self, size: int | None = None) -> list[Any]:
        """The next rows, ``size`` at most (``arraysize`` by default)."""
        wanted = self.arraysize if size is None else size
        with _Call(self.connection, self) as call:
            rows = super().fetchmany(wanted)
            call.active = len(rows) == wanted
            return rows

    def fetchall(self) -> list[Any]:
        """The rows left."""
        with _Call(self.connection, self) as call:
            rows = super().fetchall()
            call.active = False
            return rows

    def __next__(self) -> Any:
        """The next row, iterating."""
        with _Call(self.connection, self) as call:
            call.active = False  # unless there is a row
            row = super().__next__()
            call.active = True
            return row

    def close(self) -> None:
        """Close the cursor."""
        with _Call(self.connection, self) as call:
            call.active = False
            super().close()

    def __del__(self) -> None:
        """Close inside the gate: the collector's close resets the statement otherwise.

        The statement is uncounted even if the close fails.
        """
        with contextlib.suppress(Exception):
            self.close()


class GatedConnection(sqlite3.Connection):
    """A connection whose every call into SQLite passes the gate.

    Made by ``sqlite3.connect(..., factory=GatedConnection)``; its cursors are
    ``GatedCursor``.
    """

    counted_by: tuple[Gate, int] | None = None
    """The gate counting this connection's open transaction (and the thread holding it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Open the database (``sqlite3.connect``'s arguments), inside the gate."""
        self.cursors: weakref.WeakSet[GatedCursor] = weakref.WeakSet()
        """Its cursors counted once (a close of the connection ends their statements)."""
        _gate.enter(holding=False)
        try:
            super().__init__(*args, **kwargs)
        finally:
            _gate.leave()

    def cursor(self, factory: Any = GatedCursor) -> Any:
        """A new cursor, gated unless ``factory`` says otherwise."""
        return super().cursor(factory)

    def execute(self, *args: Any) -> Any:
        """Run one statement on a new cursor."""
        return self.cursor().execute(*args)

    def executemany(self, *args: Any) -> Any:
        """Run one statement for each set of parameters, on a new cursor."""
        return self.cursor().executemany(*args)

    def executescript(self, *args: Any) -> Any:
        """Run a script of statements on a new cursor."""
        return self.cursor().executescript(*args)

    def commit(self) -> None:
        """Commit the transaction."""
        with _Call(self):
            super().commit()

    def rollback(self) -> None:
        """Roll the transaction back."""
        with _Call(self):
            super().rollback()

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back)."""
        try:
            with _Call(self):
                super().close()
        finally:
            _gate.forget(self)

    def create_function(self, *args: Any, **kwargs: Any) -> None:
        """Define an SQL function (SQLAlchemy's ``regexp``), inside the gate."""
        with _Call(self):
            super().create_function(*args, **kwargs)

    def __exit__(self, *exc: Any) -> Any:
        """Commit or roll back (``with connection:``), inside the gate."""
        with _Call(self):
            return super().__exit__(*exc)

    def __del__(self) -> None:
        """Close inside the gate: the collector closes a connection dropped unclosed.

        It does so in whichever thread it runs, maybe while another thread forks. A close
        that fails there (another thread's connection) is the collector's to finish; its
        count goes all the same (``close``).
        """
        with contextlib.suppress(Exception):
            self.close()


SQLITE_CONNECT_ARGS: dict[str, Any] = {"factory": GatedConnection}
"""``connect_args`` for an SQLAlchemy engine on SQLite whose connections pass the gate."""
