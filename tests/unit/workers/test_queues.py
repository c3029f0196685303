"""The queue topology is readable without Celery, and it is what the app routes by."""

from __future__ import annotations

import subprocess
import sys

from workers.queues import ALL_QUEUES, FINALIZE_TASK, QUEUES, STEP_TASK, VERIFY_TASK


def test_each_task_has_its_queue_and_every_queue_is_listed() -> None:
    assert QUEUES == {STEP_TASK: "llm", VERIFY_TASK: "verify", FINALIZE_TASK: "control"}
    assert ALL_QUEUES == ("control", "llm", "verify")


def test_reading_the_queues_imports_neither_celery_nor_kombu() -> None:
    probe = (
        "import sys, workers.queues; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_app_routes_each_task_to_its_queue() -> None:
    from workers.app import app

    routes = app.conf.task_routes
    assert {name: route["queue"] for name, route in routes.items()} == QUEUES
    assert tuple(app.conf.merlin_queues) == ALL_QUEUES
    assert set(app.tasks) >= set(QUEUES)
