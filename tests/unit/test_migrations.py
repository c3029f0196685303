"""The schema comes only from Alembic, and the migrations match the models."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from merlin_flow.errors import StoreError
from merlin_flow.store import Base, Database, open_database, upgrade
from merlin_flow.store.database import alembic_config, current_revision, head_revision, table_names

OUR_TABLES = {"jobs", "steps", "attempts", "llm_calls", "events"}


def test_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_upgrade_from_empty_creates_the_schema(database_url: str) -> None:
    db = Database(database_url)
    assert current_revision(db) is None
    upgrade(db)
    assert current_revision(db) == head_revision()
    assert set(table_names(db)) >= OUR_TABLES
    db.dispose()


def test_models_match_migrations(database_url: str) -> None:
    db = Database(database_url)
    upgrade(db)
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    db.dispose()


def test_broker_tables_are_not_ours(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kombu's and Celery's tables in the same database are left alone by autogenerate."""
    db = Database(f"sqlite:///{tmp_path / 'shared.db'}")
    upgrade(db)
    with db.engine.begin() as conn:
        conn.execute(text("CREATE TABLE kombu_message (id INTEGER PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE celery_taskmeta (id INTEGER PRIMARY KEY)"))
    config = alembic_config(db.url)
    env = ScriptDirectory.from_config(config)
    # Run autogenerate the way `alembic revision --autogenerate` does, through env.py.
    from alembic.runtime.environment import EnvironmentContext

    diffs: list[object] = []

    def collect(rev: object, context: MigrationContext) -> list[object]:
        diffs.extend(compare_metadata(context, Base.metadata))
        return []

    with db.engine.connect() as conn:
        config.attributes["connection"] = conn
        with EnvironmentContext(config, env, fn=collect):
            env.run_env()
    assert diffs == []
    db.dispose()


def test_embedded_sqlite_is_upgraded_on_first_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = open_database(f"sqlite:///{tmp_path / 'fresh' / 'merlin.db'}")
    assert current_revision(db) == head_revision()
    with db.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    db.dispose()


def test_server_database_must_be_upgraded_explicitly(postgres_url: str) -> None:
    import pytest

    from merlin_flow.errors import StoreError

    with pytest.raises(StoreError, match="merlin db upgrade"):
        open_database(postgres_url)
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    open_database(postgres_url).dispose()


def test_a_server_whose_connection_is_cut_is_opened_on_a_later_try(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server closes the connection (a restart, a failover) just as `merlin submit`
    # opens the database: the first read fails, a later one succeeds. A refusal that is
    # not a lost connection is not tried again.
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from merlin_flow.store import database

    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    real, tries = database.current_revision, []
    lost = Exception("server closed the connection unexpectedly")

    def cut_first(opened: Database) -> str | None:
        tries.append(1)
        if len(tries) == 1:
            raise OperationalError("SELECT version_num", {}, lost)
        return real(opened)

    monkeypatch.setattr(database, "current_revision", cut_first)
    open_database(postgres_url).dispose()
    assert len(tries) == 2

    def refused(opened: Database) -> str | None:
        tries.append(1)
        raise ProgrammingError("SELECT version_num", {}, Exception("permission denied"))

    tries.clear()
    monkeypatch.setattr(database, "current_revision", refused)
    with pytest.raises(StoreError, match="permission denied"):
        open_database(postgres_url)
    assert len(tries) == 1
