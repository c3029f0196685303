"""Worker roles, queue topology and the Celery app entry point (``celery -A workers.app``)."""
