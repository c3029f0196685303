"""Fixtures of the unit tests: a migrated SQLite store and settings in the test's folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from merlin_flow.settings import Settings
from merlin_flow.store import Database, open_database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A migrated SQLite store (tests that need Postgres too override it with database_url)."""
    database = open_database(f"sqlite:///{tmp_path / 'merlin.db'}")
    yield database
    database.dispose()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")
