"""The backends end-to-end tests run on: the embedded defaults, and Redis + Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from merlin_flow.store import Database, open_database, upgrade


@dataclass
class Backend:
    """Where a test's jobs live: the environment for merlin processes, and the database."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    database_url: str | None = None
    opened: list[Database] = field(default_factory=list)

    def open(self, home: Path) -> Database:
        """The test's database (the embedded one under ``home`` by default)."""
        db = open_database(self.database_url or f"sqlite:///{home / 'merlin.db'}")
        self.opened.append(db)
        return db

    def close(self) -> None:
        """Close every database connection the test opened."""
        for db in self.opened:
            db.dispose()


@pytest.fixture(params=["embedded", "redis+postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The same end-to-end test on SQLite + the embedded broker, and on Redis + Postgres."""
    if request.param == "embedded":
        embedded = Backend("embedded")
        yield embedded
        embedded.close()
        return
    redis_url = request.getfixturevalue("redis_url")
    postgres_url = request.getfixturevalue("postgres_url")
    db = Database(postgres_url)
    upgrade(db)  # what `merlin db upgrade` does before the workers start
    db.dispose()
    scaled = Backend(
        "redis+postgres",
        env={"MERLIN_BROKER_URL": redis_url, "MERLIN_DATABASE_URL": postgres_url},
        database_url=postgres_url,
    )
    yield scaled
    scaled.close()
