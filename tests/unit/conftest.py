"""Fixtures of the unit tests: a migrated SQLite store and settings in the test's folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from merlin_flow.settings import Settings
from merlin_flow.store import Database, open_database, upgrade


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated to the head, copied by every test that wants a store."""
    path = tmp_path_factory.mktemp("template") / "merlin.db"
    open_database(f"sqlite:///{path}").dispose()
    return path


@pytest.fixture
def db(tmp_path: Path, migrated_sqlite: Path) -> Iterator[Database]:
    """A migrated SQLite store (tests that need Postgres too override it with database_url)."""
    path = tmp_path / "merlin.db"
    shutil.copyfile(migrated_sqlite, path)
    database = open_database(f"sqlite:///{path}")
    yield database
    database.dispose()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest.fixture
def store(database_url: str) -> Iterator[Database]:
    """A migrated database of this test's own: SQLite in tmp_path, or a new Postgres one."""
    database = Database(database_url)
    upgrade(database)
    yield database
    database.dispose()
