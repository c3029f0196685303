"""Flower on merlin's app, over Redis: its HTTP API shows a running job's tasks."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import urllib.error
import urllib.request
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

pytestmark = pytest.mark.e2e
AUTH = "merlin:s3cret"


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
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def test_flower_api_lists_the_tasks_of_a_running_job(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    env = merlin_env(
        tmp_path / "home", MERLIN_BROKER_URL=redis_url, MERLIN_DATABASE_URL=postgres_url
    )
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=2)
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
        assert _get(f"{base}/api/tasks", auth=None)[0] == 401  # the API needs the password
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
        )
        job_id = submitted.stdout.strip()

        def job_tasks() -> dict[str, Any]:
            status, tasks = _get(f"{base}/api/tasks")
            assert status == 200
            return {
                uuid: task for uuid, task in (tasks or {}).items() if job_id in (task["args"] or "")
            }

        # While the job runs (step "slow" sleeps), Flower has its first tasks.
        running = wait_for(
            lambda: (
                (t := job_tasks()) and any(v["name"] == "merlin.step" for v in t.values()) and t
            ),
            60,
            "Flower to see the job's step tasks",
        )
        assert merlin(env, "status", job_id, "--json").returncode == 0
        assert json.loads(merlin(env, "status", job_id, "--json").stdout)["finished_at"] is None
        names = {task["name"] for task in running.values()}
        assert names <= {"merlin.step", "merlin.verify", "merlin.finalize"}
        assert any(task["args"] == f"('{job_id}', 'fix')" for task in running.values())
        # Flower reads the same app: finalize shows up once the job ends.
        wait_for(
            lambda: any(t["name"] == "merlin.finalize" for t in job_tasks().values()),
            120,
            "the job's finalize task in Flower",
        )
    finally:
        stop_worker(worker)
        flower.terminate()
        flower.wait(timeout=20)
        flower_log.close()


def test_flower_refuses_the_embedded_broker(tmp_path: Path) -> None:
    result = merlin(merlin_env(tmp_path / "home"), "flower")
    assert result.returncode == 2
    assert "Flower needs the Redis broker" in result.stderr
