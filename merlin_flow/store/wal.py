"""Switching a SQLite database to write-ahead logging, from several processes at once.

SQLite may answer ``PRAGMA journal_mode=WAL`` with "database is locked" at once, without
waiting through the busy timeout, while another connection holds a lock the change needs:
two processes opening a new database together (two workers' first repository maps, a
worker and a CLI on a fresh ``MERLIN_HOME``). The mode is kept in the file, so only the
first connection has to change it; the others read it and find it set.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

LOCKED = ("database is locked", "database table is locked", "busy")


def enable_wal(cursor: Any, seconds: float, sleep: Any = time.sleep) -> None:
    """Put the database of ``cursor`` (a DB-API cursor or sqlite3 connection) in WAL mode.

    A lock held by another connection is waited out, for at most ``seconds``; any other
    error is raised at once.
    """
    deadline = time.monotonic() + seconds
    pause = 0.01
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            locked = any(words in str(exc).lower() for words in LOCKED)
            if not locked or time.monotonic() >= deadline:
                raise
        sleep(pause)
        pause = min(pause * 2, 0.2)
