"""RabbitMQ as the broker: real workers of both roles, Flower and doctor on a vhost of the
tests' own, and a step longer than the broker's consumer timeout.

RabbitMQ closes the channel of a consumer that holds a message unacknowledged for longer
than ``consumer_timeout``; Celery took that for an unrecoverable error and the worker
died. merlin acknowledges a task's message on RabbitMQ when the task starts
(``workers/app.py``), so a running step holds none.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import (
    MERLIN,
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)
from tests.e2e.test_flower import AUTH, _free_port, _get, _job_tasks
from tests.rabbitmq import lowered_consumer_timeout, own_vhost

pytestmark = pytest.mark.e2e

LLM_ROLE = ("--queues", "llm,control", "--pool", "threads")
VERIFY_ROLE = ("--queues", "verify", "--pool", "prefork")

SLOW_AND_QUICK = """\
rules:
  - match: 'Step long \\('
    turn: 0
    reply:
      delay: DELAY
      tool_calls:
        - name: write_file
          arguments: {path: long.txt, content: "slow\\n"}
  - match: 'Step long \\('
    turn: 1
    reply: {content: "long.txt written"}
  - match: 'Step short \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: short.txt, content: "quick\\n"}
  - match: 'Step short \\('
    turn: 1
    reply: {content: "short.txt written"}
"""


def _one_step(folder: Path, step: str, exit_command: str) -> Path:
    path = folder / f"{step}.yaml"
    path.write_text(
        f"title: {step}\nsteps:\n  - id: {step}\n    step_type: Feature\n"
        f"    description: write {step}.txt\n    exit_command: {exit_command}\n"
    )
    return path


@pytest.fixture
def amqp_url() -> Iterator[str]:
    with own_vhost() as url:
        yield url


def _workers(env: dict[str, str], tmp_path: Path) -> list[subprocess.Popen[bytes]]:
    return [
        start_worker(env, tmp_path / "llm.log", *LLM_ROLE),
        start_worker(env, tmp_path / "verify.log", *VERIFY_ROLE),
    ]


def _submit(env: dict[str, str], tasklist: Path, repo: Path, config: Path) -> str:
    submitted = merlin(env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def _ended(env: dict[str, str], job_id: str, timeout: float) -> dict[str, Any]:
    return wait_for(
        lambda: (view := status_json(env, job_id))["finished_at"] and view,
        timeout,
        f"job {job_id} to end",
        poll=1,
    )


def test_a_job_runs_on_rabbitmq_with_flower_and_doctor(
    tmp_path: Path, py_repo: Path, amqp_url: str
) -> None:
    tasklist, config = write_job_files(tmp_path / "job")
    env = merlin_env(tmp_path / "home", MERLIN_BROKER_URL=amqp_url)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "flower.log").open("wb") as flower_log:
        flower = subprocess.Popen(
            [*MERLIN, "flower", "--port", str(port), "--basic-auth", AUTH],
            env=env, stdout=flower_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    workers = _workers(env, tmp_path)
    try:
        wait_for(lambda: _get(f"{base}/api/workers")[0] == 200, 60, "Flower to answer")
        job_id = _submit(env, tasklist, py_repo, config)
        view = _ended(env, job_id, 180)
        assert view["status"] == "completed", view
        assert [step["status"] for step in view["steps"]] == ["Completed"] * 3
        # Flower saw every task of the job, over RabbitMQ's event exchange.
        tasks = wait_for(
            lambda: (t := _job_tasks(base, job_id)) and len(t) == 7 and t, 30, "7 tasks"
        )
        assert {task["state"] for task in tasks.values()} == {"SUCCESS"}
        _, seen = _get(f"{base}/api/workers?refresh=1")
        assert len(seen or {}) == 2, seen
        # doctor counts each queue's consumers through the broker.
        doctor = merlin(env, "doctor", "--json", "--config", str(config))
        checks = {check["name"]: check for check in json.loads(doctor.stdout)}
        assert checks["broker"]["verdict"] == "ok"
        for queue in ("llm", "control", "verify"):
            assert checks[f"queue {queue}"]["detail"] == "1 worker(s) consuming", checks
    finally:
        for worker in workers:
            stop_worker(worker)
        flower.terminate()
        flower.wait(timeout=20)


@pytest.mark.timeout(360)  # about 90 s when it works; with late acks it never ends
def test_a_step_longer_than_the_consumer_timeout_completes_and_no_worker_dies(
    tmp_path: Path, py_repo: Path, amqp_url: str
) -> None:
    """consumer_timeout lowered to 5 s; a step whose model call takes 30 s (on the threads
    of the llm worker) and whose exit command takes 30 s (on the processes of the verify
    worker, where Celery would cancel a task whose message timed out); a second job's
    messages waiting on the same one-slot workers meanwhile. RabbitMQ checks the timeout
    on the channel's tick, lowered to 1 s (5 s + 1 s at most), so each outlasts it, with
    room for a slow machine (a 15 s step left the second job's message too little)."""
    folder = tmp_path / "job"
    _, config = write_job_files(folder, local=SLOW_AND_QUICK.replace("DELAY", "30"))
    env = merlin_env(tmp_path / "home", MERLIN_BROKER_URL=amqp_url)
    with lowered_consumer_timeout(5_000):
        workers = _workers(env, tmp_path)
        try:
            long_step = _one_step(folder, "long", "sh -c 'sleep 30 && test -f long.txt'")
            slow = _submit(env, long_step, py_repo, config)
            wait_for(
                lambda: status_json(env, slow)["steps"][0]["status"] == "InProgress", 60, "the step"
            )
            started = time.monotonic()
            quick = _submit(env, _one_step(folder, "short", "test -f short.txt"), py_repo, config)
            views = [_ended(env, job, 400) for job in (slow, quick)]
            took = time.monotonic() - started
            alive = [worker.poll() is None for worker in workers]
        finally:
            for worker in workers:
                stop_worker(worker)
    logs = [(tmp_path / f"{role}.log").read_text() for role in ("llm", "verify")]
    for log in logs:
        assert "Unrecoverable error" not in log
        # The quick job's message, waiting on the busy worker, did time out: the consumer
        # reconnected and the worker went on.
        assert "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out" in log
        assert "Failed to cancel active request" not in log  # no running task had to go
    assert alive == [True, True], logs
    assert took > 60  # the model call and the exit command each outlived the timeout
    for view in views:
        assert view["status"] == "completed", view
        assert len(view["steps"][0]["attempts"]) == 1, view  # run once, never twice
