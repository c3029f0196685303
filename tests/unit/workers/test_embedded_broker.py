"""The embedded broker's channel and engine options (workers.embedded_broker)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import kombu
import kombu.transport.sqlalchemy as sqla_transport
import pytest
from sqlalchemy.exc import OperationalError

from merlin_flow.store.fork_gate import GatedConnection
from workers import embedded_broker


@pytest.fixture
def installed() -> object:
    """kombu's transport as merlin's workers set it up, put back afterwards."""
    before = (sqla_transport.Transport.Channel, sqla_transport.Transport.polling_interval)
    embedded_broker.install(0.1)
    yield
    sqla_transport.Transport.Channel, sqla_transport.Transport.polling_interval = before


def test_a_fetch_whose_commit_failed_leaves_the_broker_unlocked(
    tmp_path: Path, installed: object
) -> None:
    """kombu's own channel kept the failed transaction, and its write lock, open: every
    worker then waited out its busy timeout at each poll, for good."""
    path = tmp_path / "broker.db"
    options = embedded_broker.transport_options()
    options["connect_args"] = {**options["connect_args"], "timeout": 0.2}  # a short wait
    with kombu.Connection(f"sqla+sqlite:///{path}", transport_options=options) as connection:
        channel = connection.default_channel
        assert isinstance(channel, embedded_broker.Channel)
        channel._put("llm", {"body": "the step"})
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM kombu_message").fetchall()  # keeps a read lock
        with pytest.raises(OperationalError, match="locked"):
            channel._get("llm")  # its commit cannot get the lock past the reader's
        reader.execute("ROLLBACK")
        reader.close()
        other = sqlite3.connect(path, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # the failed fetch holds no lock
        other.execute("ROLLBACK")
        other.close()
        assert channel._get("llm") == {"body": "the step"}  # not lost, and the channel works


def test_the_brokers_connections_are_gated_and_unpooled(tmp_path: Path, installed: object) -> None:
    from sqlalchemy.pool import NullPool

    path = tmp_path / "broker.db"
    with kombu.Connection(
        f"sqla+sqlite:///{path}", transport_options=embedded_broker.transport_options()
    ) as connection:
        engine, _ = connection.default_channel._open()
        assert isinstance(engine.pool, NullPool)
        with engine.connect() as raw:
            assert isinstance(raw.connection.driver_connection, GatedConnection)
