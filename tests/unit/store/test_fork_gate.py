"""A fork never catches a thread inside SQLite, nor a transaction open (store.fork_gate).

Without the gate, a child forked while another thread of its parent queries SQLite
inherits SQLite's process-wide mutexes locked, and its own first query hangs: on this
machine about one fork in four when the other thread only reads, one in two when it opens
and closes connections. A child forked while the parent holds a write transaction
inherits SQLite's record of the lock, held by nobody. With the three threads of the test
below, 15 children in 40 failed or hung without the gate.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.store.fork_gate import Gate, GatedConnection, GatedCursor, gate
from workers.sweeper import _broker_engine

FORKS = 20
CHILD_SECONDS = 5.0
"""A child's query takes milliseconds; one not done after this long hangs."""


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "forked.db"
    with GatedConnection(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (n INTEGER)")
        db.execute("INSERT INTO t VALUES (1)")
    db.close()
    return path


def _fork_and_query(path: Path) -> bool:
    """Fork; the child opens ``path``, reads and writes. True if it did so in time."""
    pid = os.fork()
    if pid == 0:  # the child: a query and a write, then out, whatever happens
        code = 3
        try:
            db = GatedConnection(path, isolation_level=None, timeout=CHILD_SECONDS)
            db.execute("SELECT count(*) FROM t").fetchone()
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (2)")
            db.execute("COMMIT")
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.002)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return False


def test_children_forked_while_threads_use_sqlite_never_hang(tmp_path: Path) -> None:
    path = _database(tmp_path)
    stop = threading.Event()
    calls = [0, 0, 0]

    def use(n: int) -> None:  # what a consumer and a sweeper thread do
        db = GatedConnection(path, isolation_level=None, check_same_thread=False, timeout=30)
        while not stop.is_set():
            if n == 0:  # reads on one connection
                db.execute("SELECT count(*) FROM t").fetchall()
            elif n == 1:  # a connection per read
                fresh = GatedConnection(path)
                fresh.execute("SELECT count(*) FROM t").fetchone()
                fresh.close()
            else:  # write transactions, each held a moment, with room for the child's
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO t VALUES (1)")
                time.sleep(0.002)
                db.execute("COMMIT")
                time.sleep(0.005)
            calls[n] += 1
        db.close()

    threads = [threading.Thread(target=use, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        while min(calls) == 0:
            time.sleep(0.001)
        before = list(calls)
        failed = sum(not _fork_and_query(path) for _ in range(FORKS))
        after = list(calls)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failed == 0
    assert all(b > a for a, b in zip(before, after, strict=True))  # all went on meanwhile
    assert gate().idle


def _in_thread(gate: Gate, holding: bool, until: threading.Event | None = None) -> threading.Event:
    """A thread that goes in (``holding`` or not), stays until ``until``, comes out."""
    came_in = threading.Event()

    def go() -> None:
        gate.enter(holding)
        came_in.set()
        if until is not None:
            until.wait()
        gate.leave()

    threading.Thread(target=go, daemon=True).start()
    return came_in


def test_a_fork_waits_for_those_inside_and_then_lets_nobody_in() -> None:
    gate = Gate()
    stay_in, fork_done = threading.Event(), threading.Event()
    assert _in_thread(gate, holding=False, until=stay_in).wait(5)
    closed: list[bool] = []

    def fork() -> None:  # what the at-fork hooks do around os.fork
        closed.append(gate.close(timeout=10))
        fork_done.wait()
        gate.open()

    threading.Thread(target=fork, daemon=True).start()
    time.sleep(0.1)
    assert not closed  # one is inside: the fork waits
    # A call on a connection whose transaction is open goes in; a new one waits.
    assert _in_thread(gate, holding=True).wait(5)
    newcomer = _in_thread(gate, holding=False)
    assert not newcomer.wait(0.2)
    stay_in.set()
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [True]
    # While the fork runs, nobody goes in, holding or not.
    holder = _in_thread(gate, holding=True)
    assert not holder.wait(0.2)
    assert not newcomer.is_set()
    fork_done.set()
    assert holder.wait(5)
    assert newcomer.wait(5)


def test_a_fork_goes_ahead_once_its_wait_is_over() -> None:
    gate, stay_in = Gate(), threading.Event()
    assert _in_thread(gate, holding=False, until=stay_in).wait(5)
    begun = time.monotonic()
    assert gate.close(timeout=0.2) is False
    assert time.monotonic() - begun < 5
    gate.open()
    stay_in.set()


def test_merlins_sqlite_connections_pass_the_gate(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'merlin.db'}")
    try:
        with db.engine.connect() as connection:
            raw = connection.connection.driver_connection
            assert isinstance(raw, GatedConnection)
            assert isinstance(raw.cursor(), GatedCursor)
    finally:
        db.dispose()
    engine = _broker_engine(Settings(home=tmp_path / "home"))
    try:
        (tmp_path / "home").mkdir()
        with engine.connect() as connection:
            assert isinstance(connection.connection.driver_connection, GatedConnection)
    finally:
        engine.dispose()


def test_a_fork_waits_for_an_open_transaction_to_end(tmp_path: Path) -> None:
    db = GatedConnection(_database(tmp_path), isolation_level=None, check_same_thread=False)
    cursor = db.cursor()  # kept: a cursor the collector closed would wait for the fork
    cursor.execute("BEGIN")
    cursor.execute("SELECT count(*) FROM t").fetchall()  # a read transaction, open
    closed: list[bool] = []
    fork_done = threading.Event()

    def fork() -> None:  # what the at-fork hooks do around os.fork
        closed.append(gate().close(timeout=10))
        fork_done.wait()
        gate().open()

    forker = threading.Thread(target=fork)
    forker.start()
    time.sleep(0.1)
    assert not closed
    cursor.execute("SELECT count(*) FROM t").fetchall()  # its transaction goes on meanwhile
    cursor.execute("COMMIT")
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [True]
    fork_done.set()
    forker.join()
    cursor.close()
    db.close()
    assert gate().idle


def test_a_thread_holding_a_transaction_goes_on_while_a_fork_waits(tmp_path: Path) -> None:
    """It may open or use another connection (a second pooled one, another engine): made
    to wait, it would keep its lock, and the fork would wait for it until it gave up."""
    path = _database(tmp_path)
    holding, waited = threading.Event(), []

    def hold() -> None:
        first = GatedConnection(path, isolation_level=None, check_same_thread=False)
        first.execute("BEGIN IMMEDIATE")
        first.execute("INSERT INTO t VALUES (1)")
        holding.set()
        time.sleep(0.2)  # the fork is waiting by now
        begun = time.monotonic()
        second = GatedConnection(path)
        second.execute("SELECT count(*) FROM t").fetchall()
        second.close()
        waited.append(time.monotonic() - begun)
        first.execute("COMMIT")
        first.close()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    begun = time.monotonic()
    assert _fork_and_query(path)  # forked once the transaction ended; the child writes
    holder.join()
    assert waited[0] < 0.1
    assert time.monotonic() - begun < 1.5  # not the fork's whole wait
    assert gate().idle
