"""Flower on merlin's app, over Redis: its HTTP API shows a job's tasks, labelled with the
job, step, attempt and tier, and each task's readable result (a failed verification as a
failure naming what follows it)."""

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
COLUMNS = ["name", "args", "state", "result", "exception", "received", "runtime", "worker", "uuid"]


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
) -> Iterator[tuple[dict[str, str], str]]:
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
    return f"job={job_id} step={step} attempt={attempt} tier={tier}"


def test_flower_api_lists_the_tasks_of_a_running_job(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=2)
    with _flower_and_worker(tmp_path, redis_url, postgres_url) as (env, base):
        assert _get(f"{base}/api/tasks", auth=None)[0] == 401  # the API needs the password
        # The tasks page opens on the columns that tell a job's tasks apart.
        status, page = _get(f"{base}/tasks")
        assert status == 200
        assert re.findall(r'<th data-column="(\w+)"', page) == COLUMNS
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
    ] + [("merlin.finalize", f"job={job_id}", "SUCCESS")]
    results = [row[4] for row in rows]
    assert all(
        re.fullmatch(r"'attempt 1 \(execute\) on local: committed \w{10}'", r)
        for r in results[0:6:2]
    )
    assert results[1:6:2] == ["'passed'"] * 3
    assert results[6] == "'job completed'"


def test_flower_shows_a_failed_verification_and_the_escalation_that_follows(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    with _flower_and_worker(tmp_path, redis_url, postgres_url) as (env, base):
        waited = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config),
            "--wait", "--json",
        )  # fmt: skip
        assert waited.returncode == 0, waited.stderr
        job_id = json.loads(waited.stdout)["id"]

        def all_ended() -> dict[str, Any] | None:
            tasks = _job_tasks(base, job_id)
            states = [task["state"] for task in tasks.values()]
            if len(tasks) == 7 and set(states) <= {"SUCCESS", "FAILURE"}:
                return tasks
            return None

        tasks = wait_for(all_ended, 60, "Flower to see the job's seven tasks end")
    by_time = sorted(tasks.values(), key=lambda task: task["received"])
    shown = [(t["name"], t["args"], t["state"], t["result"] or t["exception"]) for t in by_time]
    local_1, local_2 = _label(job_id, "fix", 1, "local"), _label(job_id, "fix", 2, "local")
    premium_3 = _label(job_id, "fix", 3, "premium")
    assert [row[:3] for row in shown] == [
        ("merlin.step", local_1, "SUCCESS"),
        ("merlin.verify", local_1, "FAILURE"),
        ("merlin.step", local_2, "SUCCESS"),
        ("merlin.verify", local_2, "FAILURE"),
        ("merlin.step", premium_3, "SUCCESS"),
        ("merlin.verify", premium_3, "SUCCESS"),
        ("merlin.finalize", f"job={job_id}", "SUCCESS"),
    ]
    assert shown[1][3] == "failed: exit 1 -> fix on local (attempt 2)"
    assert shown[3][3] == "failed: exit 1 -> escalate to premium (attempt 3)"
    assert shown[4][3].startswith("'attempt 3 (escalate) on premium: committed ")
    assert shown[5][3] == "'passed'"
    assert shown[6][3] == "'job completed'"
    # Each new attempt is a child of the verification that failed; one root for the job.
    assert by_time[2]["parent_id"] == by_time[1]["uuid"]
    assert by_time[4]["parent_id"] == by_time[3]["uuid"]
    assert len({task["root_id"] for task in by_time}) == 1


def test_flower_refuses_the_embedded_broker(tmp_path: Path) -> None:
    result = merlin(merlin_env(tmp_path / "home"), "flower")
    assert result.returncode == 2
    assert "Flower needs the Redis broker" in result.stderr
