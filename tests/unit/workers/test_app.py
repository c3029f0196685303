"""The Celery app: its broker from the settings, and which app merlin's tasks publish through."""

from __future__ import annotations

from pathlib import Path

from celery import current_app

from merlin_flow.settings import Settings
from workers.app import create_app


def test_an_app_that_only_asks_the_broker_does_not_redirect_the_tasks(tmp_path: Path) -> None:
    """`merlin doctor` builds an app to ask the broker; a submit after it in the same
    process must still publish to its own broker (a test once sent it to another's)."""
    before = current_app._get_current_object()
    try:
        publishing = create_app(Settings(home=tmp_path / "one"))
        assert current_app._get_current_object() is publishing
        asking = create_app(Settings(home=tmp_path / "two"), current=False)
        assert current_app._get_current_object() is publishing
        assert str(tmp_path / "two") in asking.conf.broker_url
        assert str(tmp_path / "two") not in publishing.conf.broker_url
    finally:  # the process's own app again, for the tests after this one
        before.set_default()
        before.set_current()


def test_the_embedded_broker_is_unpooled(tmp_path: Path) -> None:
    """A session whose commit failed (a full disk) keeps its connection: pooled, 15 of
    them stopped the worker ("QueuePool limit"); unpooled, each reconnect has its own."""
    from sqlalchemy.pool import NullPool

    before = current_app._get_current_object()
    try:
        app = create_app(Settings(home=tmp_path / "home"), current=False)
        with app.connection_for_write() as connection:
            engine, _ = connection.default_channel._open()
            assert isinstance(engine.pool, NullPool)
            connection.default_channel._put("control", {"body": "x"})  # it works
    finally:
        before.set_default()
        before.set_current()
