"""Alembic environment for merlin_flow.

The database may also hold the embedded broker's tables (kombu_*) or Celery result
tables (celery_*); they are not ours, so autogenerate must never propose dropping them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine

from alembic import context
from merlin_flow.store.models import Base

FOREIGN_TABLE_PREFIXES = ("kombu_", "celery_")

config = context.config
target_metadata = Base.metadata


def include_name(name: str | None, type_: str, _parents: dict[str, Any]) -> bool:
    if type_ == "table" and name is not None:
        return not name.startswith(FOREIGN_TABLE_PREFIXES)
    return True


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        include_name=include_name,
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
