"""Transitional (issue 11): the Celery side now lives in ``workers/`` (tasks and canvas).

Kept only until the CLI imports ``workers.canvas``; not public.
"""

from workers.canvas import enqueue_job

__all__ = ["enqueue_job"]
