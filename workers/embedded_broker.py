"""The embedded broker: kombu's SQLAlchemy transport on SQLite under MERLIN_HOME.

kombu passes ``broker_transport_options`` to ``create_engine``, so what the engine needs
goes there (``transport_options``); the rest is set on kombu's classes (``install``):

- the polling interval (a ``polling_interval`` among the engine's options crashes the
  worker);
- a channel that rolls back a fetch that failed. kombu's ``Channel._get`` takes the write
  lock (``BEGIN IMMEDIATE``), marks the message delivered and commits in a ``finally``,
  with no rollback. When that commit fails (the disk is full; a reader kept the lock past
  the busy timeout), SQLite keeps the transaction open, and the write lock with it. The
  consumer then reconnects on a new channel while the old connection, held by the failed
  session, locks every process out of the broker for good: each poll waits out the busy
  timeout and fails with "database is locked".
"""

from __future__ import annotations

import contextlib
from typing import Any

import kombu.transport.sqlalchemy as sqla_transport
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from merlin_flow.store.fork_gate import SQLITE_CONNECT_ARGS


class Channel(sqla_transport.Channel):  # type: ignore[misc]
    """kombu's channel, but a fetch that fails rolls its transaction back."""

    def _get(self, queue: str) -> Any:
        try:
            return super()._get(queue)
        except SQLAlchemyError:
            with contextlib.suppress(SQLAlchemyError):
                self.session.rollback()  # the write lock goes with the transaction
            raise


def install(polling_interval: float) -> None:
    """Set what kombu's transport cannot take as an engine option (module docstring)."""
    sqla_transport.Transport.polling_interval = polling_interval
    sqla_transport.Transport.Channel = Channel


def transport_options() -> dict[str, Any]:
    """The engine options of the broker's connections (``broker_transport_options``)."""
    return {
        # A session whose commit failed keeps its connection checked out; past 15 of them
        # a pool would be spent, and the worker would stop ("Unrecoverable error:
        # QueuePool limit"). Unpooled, each reconnect has a connection of its own.
        "poolclass": NullPool,
        # The pool processes a worker forks must not inherit SQLite's locks taken by the
        # worker's own threads (merlin_flow.store.fork_gate).
        "connect_args": SQLITE_CONNECT_ARGS,
    }
