"""Connection loss on Redis + Postgres: every connection is cut in the middle of a job,
and the job still completes, with no wrong status and no step run twice at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from merlin_flow.jobs.views import job_view
from tests.conftest import POSTGRES_ADMIN_URL
from tests.e2e.conftest import Backend
from tests.e2e.helpers import (
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e


def _cut_postgres(database: str) -> int:
    """Terminate every other session on ``database``; how many were cut."""
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            cut = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"
                ),
                {"db": database},
            ).all()
        return len(cut)
    finally:
        admin.dispose()


def _cut_redis(url: str) -> int:
    """Close every client connection to Redis but this one; how many were cut."""
    client = redis.Redis.from_url(url)
    try:
        me = client.client_id()
        ids = [c["id"] for c in client.client_list() if c["id"] != me]
        for ident in ids:
            client.client_kill_filter(_id=ident)
        return len(ids)
    finally:
        client.close()


@pytest.mark.parametrize("backend", ["redis+postgres"], indirect=True)
def test_a_job_survives_its_connections_being_cut(
    tmp_path: Path, py_repo: Path, backend: Backend
) -> None:
    home = tmp_path / "home"
    env = merlin_env(home, MERLIN_SWEEP_INTERVAL="1", **backend.env)
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=2, lease_seconds=3)
    log = tmp_path / "worker.log"
    worker = start_worker(env, log, "--concurrency", "2")
    db = backend.open(home)
    try:
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
        )
        job_id = submitted.stdout.strip()

        def slow_running() -> bool:
            steps = {s["id"]: s for s in job_view(db, job_id)["steps"]}
            return any(a["status"] == "running" for a in steps["slow"]["attempts"])

        wait_for(slow_running, 90, "step 'slow' to be running")
        assert backend.database_url is not None
        database = backend.database_url.rsplit("/", 1)[1]
        assert _cut_postgres(database) > 0
        assert _cut_redis(backend.env["MERLIN_BROKER_URL"]) > 0
        most_running = 0

        def finished() -> bool:
            nonlocal most_running
            view = job_view(db, job_id)
            for step in view["steps"]:
                running = sum(1 for a in step["attempts"] if a["status"] == "running")
                most_running = max(most_running, running)
            return view["finished_at"] is not None

        wait_for(finished, 180, "the job to finish after the connections were cut", poll=0.2)
    finally:
        stop_worker(worker)
    view = job_view(db, job_id)
    assert view["status"] == "completed", log.read_text()[-4000:]
    assert [s["status"] for s in view["steps"]] == ["Completed"] * 3
    assert most_running <= 1
