"""The Celery app: broker from ``MERLIN_BROKER_URL`` (default: SQLite under MERLIN_HOME).

Settings that make delivery safe for long, expensive steps: late acks, requeue when a
pool process dies, one message reserved per process, and results ignored (job state
lives in merlin's store, not in a Celery result backend).

On RabbitMQ a task's message is acknowledged when the task starts instead: RabbitMQ
closes the channel of a consumer that holds a message unacknowledged for longer than its
``consumer_timeout`` (30 minutes by default), and a step may run for longer. A started
step is held by its lease in merlin's store, which the recovery sweep takes over if its
worker dies, so the message has done its work. A message that waits on a busy worker
can still time out; the channel error then restarts the worker's consumer
(``broker_channel_error_retry``) instead of ending the worker, and RabbitMQ gives the
message to another consumer.

The embedded ``sqla+sqlite`` broker is set up by ``workers.embedded_broker``.
"""

from __future__ import annotations

from celery import Celery

from merlin_flow.settings import Settings, get_settings
from merlin_flow.store import Database
from workers.queues import ALL_QUEUES, QUEUES

# Redis: a step may run for many minutes; its message must not be redelivered meanwhile.
# Our own leases and the recovery sweep recover lost steps much sooner.
REDIS_VISIBILITY_TIMEOUT = 6 * 3600


def create_app(settings: Settings | None = None, current: bool = True) -> Celery:
    """Build the Celery app for the given (or current) settings.

    ``current``: make it the app merlin's shared tasks publish through; False for an app
    that only asks the broker (``merlin doctor``), which must not redirect them.
    """
    settings = settings or get_settings()
    if settings.broker_is_embedded:
        from workers import embedded_broker

        embedded_broker.install(settings.broker_poll_interval)
        settings.home_dir.mkdir(parents=True, exist_ok=True)
    app = Celery(
        "merlin_flow", broker=settings.broker, include=["workers.tasks"], set_as_current=current
    )
    transport_options: dict[str, object] = {}
    if settings.broker_is_embedded:
        transport_options = embedded_broker.transport_options()
    if settings.broker.startswith(("redis://", "rediss://")):
        transport_options = {
            "visibility_timeout": REDIS_VISIBILITY_TIMEOUT,
            # Find a dead connection (a Redis restart, a dropped NAT entry) within 25 s.
            "health_check_interval": 25,
            "socket_keepalive": True,
        }
    on_rabbitmq = settings.broker.startswith(("amqp://", "amqps://", "pyamqp://"))
    app.conf.update(
        task_acks_late=not on_rabbitmq,
        broker_channel_error_retry=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue="control",
        task_routes={name: {"queue": queue} for name, queue in QUEUES.items()},
        task_create_missing_queues=True,
        broker_connection_retry_on_startup=True,
        # A lost broker connection is retried with backoff, forever in a worker; a publish
        # (submit, a chain hop) is retried with backoff before it fails.
        broker_connection_max_retries=None,
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": 6,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 3.0,
        },
        broker_transport_options=transport_options,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    app.conf.merlin_queues = ALL_QUEUES
    # Our tasks are shared tasks: make this app the one they (and chains) publish through.
    if current:
        app.set_default()
        app.set_current()
    return app


app = create_app()


def publish_job(db: Database, job_id: str) -> str | None:
    """Publish what is left of ``job_id`` through merlin's app.

    The tasks are shared, so they go through the current Celery app: a process that has
    not made merlin's app current (the dashboard, a script) would publish them to
    Celery's default broker instead. Returns why the broker refused them, or None. The
    job is recorded already, so a refusal loses nothing: a worker's recovery sweep
    publishes a queued step whose message is missing.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from workers.canvas import PUBLISH_ERRORS, enqueue_job

    app.set_default()
    app.set_current()  # this thread's, which Celery reads before the default
    try:
        enqueue_job(db, job_id)
    except (SQLAlchemyError, *PUBLISH_ERRORS) as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0]
    return None


# Connect the worker's signal hooks (litellm preload, recovery sweeper).
from workers import roles as _roles  # noqa: E402, F401
