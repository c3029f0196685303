"""The queue topology: which task goes to which queue, stated once, without Celery.

The tasks themselves live in ``workers.tasks``; ``workers.app`` routes them with
``QUEUES``. Readers that only need the names (``merlin status`` saying whether a worker
serves a job's queues, the dashboard's fleet) import this module, not Celery.
"""

from __future__ import annotations

STEP_TASK = "merlin.step"
VERIFY_TASK = "merlin.verify"
FINALIZE_TASK = "merlin.finalize"
QUEUES = {STEP_TASK: "llm", VERIFY_TASK: "verify", FINALIZE_TASK: "control"}
"""The queue of each task: model work, exit commands, and the job's bookkeeping."""
ALL_QUEUES = tuple(sorted(set(QUEUES.values())))
"""Every queue a worker may serve: ``("control", "llm", "verify")``."""
