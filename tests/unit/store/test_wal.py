"""WAL mode switched on by many processes opening one new database at once (store.wal)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.store.wal import enable_wal

OPENER = """
import sqlite3, sys, time
from pathlib import Path
from merlin_flow.store.wal import enable_wal
path, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
db = sqlite3.connect(path, timeout=30)
enable_wal(db, 30)
db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
db.execute("INSERT INTO t VALUES (1)")
db.commit()
"""


def test_processes_opening_a_new_database_together_all_get_wal(tmp_path: Path) -> None:
    for round_ in range(3):
        path, go = tmp_path / f"db{round_}.sqlite3", tmp_path / f"go{round_}"
        openers = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, str(path), str(go)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        go.touch()  # all at once
        errors = [opener.communicate(timeout=120)[1] for opener in openers]
        assert [opener.returncode for opener in openers] == [0] * 6, errors
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT count(*) FROM t").fetchone() == (6,)
        db.close()


class Locked:
    """A cursor whose journal-mode change is refused ``times`` times as locked."""

    def __init__(self, times: int, error: str = "database is locked") -> None:
        self.times, self.error, self.mode = times, error, "delete"

    def execute(self, sql: str) -> Any:
        if sql == "PRAGMA journal_mode=WAL":
            if self.times:
                self.times -= 1
                raise sqlite3.OperationalError(self.error)
            self.mode = "wal"
        return self

    def fetchone(self) -> tuple[str]:
        return (self.mode,)


def test_a_lock_is_waited_out_and_another_error_is_raised_at_once() -> None:
    pauses: list[float] = []
    cursor = Locked(times=3)
    enable_wal(cursor, 10, sleep=pauses.append)
    assert cursor.mode == "wal"
    assert pauses == [0.01, 0.02, 0.04]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        enable_wal(Locked(times=1, error="disk I/O error"), 10, sleep=pauses.append)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enable_wal(Locked(times=1000), 0, sleep=pauses.append)  # no time left to wait
