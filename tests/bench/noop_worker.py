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


def noop_chain(length: int, marker: str) -> Any:
    """A bare chain of ``length`` no-op tasks, the baseline a job is measured against.

    They alternate the llm and verify queues like a job's step and verify tasks; the
    last one, on the control queue, touches ``marker``.
    """
    signatures = [
        noop_task.si().set(queue=("llm", "verify")[index % 2]) for index in range(length - 1)
    ]
    signatures.append(noop_task.si(marker).set(queue="control"))
    return chain(*signatures)
