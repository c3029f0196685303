"""Flower on merlin's app, over Redis: its HTTP API shows a job's tasks, labelled with the
job, tier, attempt and step, and each task's readable result. A task whose work failed
(a failed verification, an attempt whose model call failed) is a FAILURE with one line
and no traceback, and the job goes on as after a success."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.cli.operations import FLOWER_COLUMNS
from merlin_flow.store import Database, upgrade
from tests.e2e.helpers import (
    MERLIN,
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
    write_job_files,
)
from tests.e2e.test_run import LOCAL_WRONG, ONE_STEP, PREMIUM_RIGHT

pytestmark = pytest.mark.e2e
AUTH = "merlin:s3cret"
AUTH_ERROR = "rules:\n  - reply: {error: AuthenticationError}\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str, auth: str | None = AUTH) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            if "json" not in response.headers.get("Content-Type", ""):
                return response.status, body.decode()
            return response.status, json.loads(body or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError):
        return 0, None


@contextmanager
def _flower_and_worker(
    tmp_path: Path, redis_url: str, postgres_url: str
) -> Iterator[tuple[dict[str, str], str]]:  # (the environment, Flower's URL)
    """`merlin flower` and a worker on Redis + Postgres: (the environment, Flower's URL)."""
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    env = merlin_env(
        tmp_path / "home", MERLIN_BROKER_URL=redis_url, MERLIN_DATABASE_URL=postgres_url
    )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    flower_log = (tmp_path / "flower.log").open("wb")
    flower = subprocess.Popen(
        [*MERLIN, "flower", "--port", str(port), "--basic-auth", AUTH],
        env=env, stdout=flower_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        wait_for(lambda: _get(f"{base}/api/workers")[0] == 200, 60, "Flower to answer")
        yield env, base
    finally:
        stop_worker(worker)
        flower.terminate()
        flower.wait(timeout=20)
        flower_log.close()


def _job_tasks(base: str, job_id: str) -> dict[str, Any]:
    """The job's tasks in Flower, by uuid (their args name the job)."""
    status, tasks = _get(f"{base}/api/tasks")
    assert status == 200
    return {uuid: task for uuid, task in (tasks or {}).items() if job_id in (task["args"] or "")}


def _label(job_id: str, step: str, attempt: int, tier: str) -> str:
    return f"{job_id} [{tier} #{attempt}] {step}"


def _ended_tasks(base: str, job_id: str, count: int) -> list[dict[str, Any]]:
    """The job's ``count`` tasks once all have ended, first received first."""

    def all_ended() -> dict[str, Any] | None:
        tasks = _job_tasks(base, job_id)
        states = [task["state"] for task in tasks.values()]
        if len(tasks) == count and set(states) <= {"SUCCESS", "FAILURE"}:
            return tasks
        return None

    tasks = wait_for(all_ended, 60, f"Flower to see the job's {count} tasks end")
    return sorted(tasks.values(), key=lambda task: task["received"])


def _assert_failed_in_one_line(task: dict[str, Any], line: str) -> None:
    """A FAILURE that says ``line`` and nothing more: no traceback, its runtime known."""
    assert (task["state"], task["result"], task["exception"]) == ("FAILURE", line, line)
    assert task["traceback"] is None
    assert task["runtime"] is not None
    assert task["runtime"] >= 0


def _assert_no_traceback_logged(log: Path) -> None:
    """Expected failures leave one INFO line each in the worker's log, no traceback."""
    text = log.read_text()
    assert " failed: " in text
    assert "Traceback" not in text
    assert "ERROR/" not in text


def test_flower_api_lists_the_tasks_of_a_running_job(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=2)
    with _flower_and_worker(tmp_path, redis_url, postgres_url) as (env, base):
        assert _get(f"{base}/api/tasks", auth=None)[0] == 401  # the API needs the password
        # The tasks page opens on merlin's columns: what matters first, the uuid last.
        status, page = _get(f"{base}/tasks")
        assert status == 200
        columns = re.findall(r'<th data-column="(\w+)"', page)
        assert columns == FLOWER_COLUMNS.split(",")
        assert set(columns[:7]) == {
            "name", "args", "state", "result", "received", "runtime", "worker"
        }  # fmt: skip
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
        )
        job_id = submitted.stdout.strip()

        # While the job runs (step "slow" sleeps), Flower has its first tasks.
        running = wait_for(
            lambda: (
                (t := _job_tasks(base, job_id))
                and any(v["name"] == "merlin.step" for v in t.values())
                and t
            ),
            60,
            "Flower to see the job's step tasks",
        )
        assert merlin(env, "status", job_id, "--json").returncode == 0
        assert json.loads(merlin(env, "status", job_id, "--json").stdout)["finished_at"] is None
        names = {task["name"] for task in running.values()}
        assert names <= {"merlin.step", "merlin.verify", "merlin.finalize"}
        assert any(task["args"] == _label(job_id, "fix", 1, "local") for task in running.values())
        # Flower reads the same app: finalize shows up once the job ends.
        wait_for(
            lambda: any(
                t["name"] == "merlin.finalize" and t["state"] == "SUCCESS"
                for t in _job_tasks(base, job_id).values()
            ),
            120,
            "the job's finalize task in Flower",
        )
        tasks = _job_tasks(base, job_id)
    rows = sorted(
        (t["received"], t["name"], t["args"], t["state"], t["result"]) for t in tasks.values()
    )
    assert [row[1:4] for row in rows] == [
        (name, label, "SUCCESS")
        for step in ("fix", "slow", "docs")
        for name, label in [
            ("merlin.step", _label(job_id, step, 1, "local")),
            ("merlin.verify", _label(job_id, step, 1, "local")),
        ]
    ] + [("merlin.finalize", job_id, "SUCCESS")]
    results = [row[4] for row in rows]
    assert all(
        re.fullmatch(r"'committed \w{10} \(attempt 1, execute on local\)'", r)
        for r in results[0:6:2]
    )
    assert results[1:6:2] == ["'passed'"] * 3
    assert results[6] == "'job completed'"


def _submit_and_wait(env: dict[str, str], tasklist: Path, config: Path, repo: Path) -> Any:
    """`merlin submit --wait --json` of the job: its view once it ended."""
    waited = merlin(
        env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config),
        "--wait", "--json",
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    return json.loads(waited.stdout)


def test_flower_shows_a_failed_verification_and_the_escalation_that_follows(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    with _flower_and_worker(tmp_path, redis_url, postgres_url) as (env, base):
        view = _submit_and_wait(env, tasklist, config, py_repo)
        assert view["status"] == "completed"
        by_time = _ended_tasks(base, view["id"], 7)
    job_id, command = view["id"], view["steps"][0]["exit_command"]
    shown = [(t["name"], t["args"], t["state"]) for t in by_time]
    local_1, local_2 = _label(job_id, "fix", 1, "local"), _label(job_id, "fix", 2, "local")
    premium_3 = _label(job_id, "fix", 3, "premium")
    assert shown == [
        ("merlin.step", local_1, "SUCCESS"),
        ("merlin.verify", local_1, "FAILURE"),
        ("merlin.step", local_2, "SUCCESS"),
        ("merlin.verify", local_2, "FAILURE"),
        ("merlin.step", premium_3, "SUCCESS"),
        ("merlin.verify", premium_3, "SUCCESS"),
        ("merlin.finalize", job_id, "SUCCESS"),
    ]
    # A failed verification: one line, what failed and what follows; no traceback.
    failed = f"`{command}` exited with code 1"
    _assert_failed_in_one_line(by_time[1], f"{failed} -> fix on local (attempt 2)")
    _assert_failed_in_one_line(by_time[3], f"{failed} -> escalate to premium (attempt 3)")
    assert by_time[4]["result"].startswith("'committed ")
    assert by_time[4]["result"].endswith(" (attempt 3, escalate on premium)'")
    assert [task["result"] for task in by_time[5:]] == ["'passed'", "'job completed'"]
    assert all(task["traceback"] is None for task in by_time)
    # Each new attempt is a child of the verification that failed; one root for the job.
    assert by_time[2]["parent_id"] == by_time[1]["uuid"]
    assert by_time[4]["parent_id"] == by_time[3]["uuid"]
    assert len({task["root_id"] for task in by_time}) == 1
    _assert_no_traceback_logged(tmp_path / "worker.log")


def test_a_failed_model_call_fails_its_step_task_and_the_job_goes_on(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    tasklist, config = write_job_files(
        tmp_path / "job", local=AUTH_ERROR, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    with _flower_and_worker(tmp_path, redis_url, postgres_url) as (env, base):
        view = _submit_and_wait(env, tasklist, config, py_repo)
        assert view["status"] == "completed"  # the chain went on after the failed task
        by_time = _ended_tasks(base, view["id"], 5)
        attempts = json.loads(merlin(env, "logs", view["id"], "--json").stdout)
    job_id = view["id"]
    local_1, premium_2 = _label(job_id, "fix", 1, "local"), _label(job_id, "fix", 2, "premium")
    assert [(t["name"], t["args"], t["state"]) for t in by_time] == [
        ("merlin.step", local_1, "FAILURE"),
        ("merlin.verify", local_1, "FAILURE"),
        ("merlin.step", premium_2, "SUCCESS"),
        ("merlin.verify", premium_2, "SUCCESS"),
        ("merlin.finalize", job_id, "SUCCESS"),
    ]
    # The step task that made the failed call: the model error's first line, no more.
    error = attempts[0]["error"].splitlines()[0]
    assert attempts[0]["status"] == "error"
    assert "authentication" in error.lower()
    _assert_failed_in_one_line(by_time[0], f"{error} (attempt 1, execute on local)")
    # Its verify still ran (handed on by the failed task, as its child), and escalated.
    assert by_time[1]["parent_id"] == by_time[0]["uuid"]
    _assert_failed_in_one_line(by_time[1], f"{error} -> escalate to premium (attempt 2)")
    assert [task["result"] for task in by_time[3:]] == ["'passed'", "'job completed'"]
    _assert_no_traceback_logged(tmp_path / "worker.log")


def test_flower_refuses_the_embedded_broker(tmp_path: Path) -> None:
    result = merlin(merlin_env(tmp_path / "home"), "flower")
    assert result.returncode == 2
    assert "Flower needs Redis or RabbitMQ as the broker" in result.stderr
