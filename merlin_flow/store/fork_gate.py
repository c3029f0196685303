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
also counts the connections holding a transaction. A fork (``os.register_at_fork``)
closes the gate and waits until no thread is inside and no transaction is open, forks,
then opens it; the child starts with a new gate. While it waits, a call that would begin
a transaction (or open a connection) waits too; a call on a connection whose transaction
is open goes in, so that the transaction ends. The wait is bounded by
``FORK_WAIT_SECONDS``: past it (a thread keeping a transaction open for long), the fork
goes ahead as it would without the gate.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from typing import Any

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
        self._inside = 0
        self._held = 0
        self._forker: int | None = None

    def enter(self, holding: bool) -> None:
        """Go inside; while a fork waits, first wait for it, unless ``holding``.

        ``holding``: the call's connection or cursor holds a lock, which only its going on
        releases.
        """
        with self._changed:
            while not holding and self._forker not in (None, threading.get_ident()):
                self._changed.wait()
            self._inside += 1

    def leave(self, held: int) -> None:
        """Come out, now holding ``held`` more locks (a transaction, a statement) or fewer."""
        with self._changed:
            self._inside -= 1
            self._held += held
            if self.idle:
                self._changed.notify_all()

    @property
    def idle(self) -> bool:
        """Whether no call is inside SQLite and no lock is held between calls."""
        return not self._inside and not self._held

    def close(self, timeout: float) -> bool:
        """Wait until idle, then keep the gate's lock until ``open``.

        False if ``timeout`` passed first (the lock is kept all the same).
        """
        self._changed.acquire()
        self._forker = threading.get_ident()
        return self._changed.wait_for(lambda: self.idle, timeout)

    def open(self) -> None:
        """After the fork, in the parent: let everyone in again."""
        self._forker = None
        self._changed.notify_all()
        self._changed.release()


_gate = Gate()


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

    __slots__ = ("active", "connection", "cursor", "gate", "held")

    def __init__(self, connection: GatedConnection, cursor: GatedCursor | None = None) -> None:
        self.connection = connection
        self.cursor = cursor

    def __enter__(self) -> _Call:
        self.gate = here = _gate
        self.held = (
            self.connection.counted_by is here,
            self.cursor is not None and self.cursor.counted_by is here,
        )
        self.active = self.held[1]
        here.enter(holding=any(self.held))
        return self

    def __exit__(self, *_: object) -> None:
        here = self.gate
        try:
            open_now = self.connection.in_transaction
        except sqlite3.ProgrammingError:  # closed
            open_now = False
        change = _recount(self.connection, self.held[0], open_now, here)
        if self.cursor is not None:
            change += _recount(self.cursor, self.held[1], self.active, here)
        here.leave(change)


def _recount(held: GatedConnection | GatedCursor, was: bool, now: bool, here: Gate) -> int:
    """1 if ``held`` now holds a lock it did not, -1 if it no longer does, else 0."""
    if now and not was:
        held.counted_by = here
        return 1
    if was and not now:
        held.counted_by = None
        return -1
    return 0


class GatedCursor(sqlite3.Cursor):
    """A cursor whose statements and fetches pass the gate."""

    connection: GatedConnection
    counted_by: Gate | None = None
    """The gate counting this cursor's statement, while it may have rows left."""

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
        """Close inside the gate: the collector's close resets the statement otherwise."""
        with contextlib.suppress(Exception):
            self.close()


class GatedConnection(sqlite3.Connection):
    """A connection whose every call into SQLite passes the gate.

    Made by ``sqlite3.connect(..., factory=GatedConnection)``; its cursors are
    ``GatedCursor``.
    """

    counted_by: Gate | None = None
    """The gate counting this connection's open transaction, if one is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Open the database (``sqlite3.connect``'s arguments), inside the gate."""
        _gate.enter(holding=False)
        try:
            super().__init__(*args, **kwargs)
        finally:
            _gate.leave(0)

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
        with _Call(self):
            super().close()

    def __exit__(self, *exc: Any) -> Any:
        """Commit or roll back (``with connection:``), inside the gate."""
        with _Call(self):
            return super().__exit__(*exc)

    def __del__(self) -> None:
        """Close inside the gate: the collector closes a connection dropped unclosed.

        It does so in whichever thread it runs, maybe while another thread forks.
        """
        with contextlib.suppress(Exception):
            self.close()


SQLITE_CONNECT_ARGS: dict[str, Any] = {"factory": GatedConnection}
"""``connect_args`` for an SQLAlchemy engine on SQLite whose connections pass the gate."""
