"""The Celery app: its broker from the settings, and which app merlin's tasks publish through."""

from __future__ import annotations

from pathlib import Path

import celery
import pytest
from celery import Celery, current_app

import workers.canvas
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from workers.app import app as merlin_app
from workers.app import create_app, publish_job


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


@pytest.mark.parametrize(
    ("broker", "late"),
    [
        ("redis://127.0.0.1:6379/0", True),
        (None, True),  # the embedded broker
        ("amqp://guest:guest@127.0.0.1:5672/merlin", False),
        ("pyamqp://guest@rabbit//", False),
    ],
)
def test_messages_are_acknowledged_late_except_on_rabbitmq(
    tmp_path: Path, broker: str | None, late: bool
) -> None:
    """RabbitMQ ends a consumer that holds a message past `consumer_timeout`: there a
    task's message is acknowledged when it starts, and a channel error restarts the
    consumer instead of ending the worker (tests/e2e/test_rabbitmq.py runs it)."""
    app = create_app(Settings(home=tmp_path, broker_url=broker), current=False)
    assert app.conf.task_acks_late is late
    assert app.conf.broker_channel_error_retry is True
    assert app.conf.worker_prefetch_multiplier == 1


def test_a_job_is_published_through_merlins_app_whatever_app_was_current(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that never made merlin's app current (the dashboard) would otherwise
    # publish the shared tasks to Celery's default broker, amqp://localhost.
    stranger = Celery("stranger", broker="memory://", set_as_current=True)
    assert celery.current_app.main == "stranger"
    seen: list[tuple[str, object]] = []
    monkeypatch.setattr(
        workers.canvas,
        "enqueue_job",
        lambda _db, job_id: seen.append((job_id, celery.current_app._get_current_object())),
    )
    try:
        assert publish_job(db, "j1") is None
    finally:
        stranger.close()
        merlin_app.set_current()
    assert seen == [("j1", merlin_app)]
    assert celery.current_app.main == "merlin_flow"


def test_a_broker_outage_is_returned_as_its_first_line(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object) -> None:
        raise OSError("Connection refused\nat 127.0.0.1:6379")

    monkeypatch.setattr(workers.canvas, "enqueue_job", refuse)
    assert publish_job(db, "j1") == "Connection refused"


def test_a_bug_is_not_mistaken_for_an_outage(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise KeyError("step")

    monkeypatch.setattr(workers.canvas, "enqueue_job", broken)
    with pytest.raises(KeyError):
        publish_job(db, "j1")
