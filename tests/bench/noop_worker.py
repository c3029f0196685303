"""merlin's Celery app plus a no-op task: the baseline the overhead benchmark measures.

Started as ``celery -A tests.bench.noop_worker worker``: the same app, settings and
routes as ``merlin worker``, with one more task that does nothing.
"""

from __future__ import annotations

import time
from typing import Any

from celery import chain

from workers.app import app

NOOP_TASK = "merlin.bench.noop"


@app.task(name=NOOP_TASK)
def noop_task(marker: str | None = None) -> None:
    """Do nothing; touch ``marker`` with the time if given."""
    if marker is not None:
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(f"{time.time():.6f}")


def noop_chain(on: Any, length: int, marker: str) -> Any:
    """A bare chain of ``length`` no-op tasks on the Celery app ``on``: the baseline.

    They alternate the llm and verify queues like a job's step and verify tasks; the
    last one, on the control queue, touches ``marker``. The signatures are made by
    ``on``, so they go to its broker: ``noop_task.si()`` would publish through this
    module's app, whose broker is that of the settings at import (another home's).
    """
    signatures = [
        on.signature(NOOP_TASK, immutable=True, queue=("llm", "verify")[index % 2])
        for index in range(length - 1)
    ]
    signatures.append(on.signature(NOOP_TASK, (marker,), immutable=True, queue="control"))
    return chain(*signatures, app=on)


def ping(on: Any, queue: str, marker: str) -> None:
    """Publish one no-op on ``queue`` of ``on``'s broker that touches ``marker``."""
    on.signature(NOOP_TASK, (marker,), immutable=True, queue=queue).apply_async()
