"""No worktree of a job is left on any machine that worked on it (issue 18, point 4).

Two "machines" share Redis, Postgres and a git URL (a bare repository served as
``file://``), each with its own MERLIN_HOME (its own worktrees and cache of the URL) and
working directory. Machine A runs the Procfile's two roles: an ``llm,control`` worker
and a ``verify`` worker. A's ``llm,control`` worker is SIGKILLed in the middle of an
attempt; machine B's ``llm,control`` worker redoes the attempt and finalizes the job,
which A's ``verify`` worker verifies. A's leftovers are removed by the sweep of A's
surviving worker, though B ended the job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from merlin_flow.jobs.views import job_view
from merlin_flow.store import Database, LlmCall, upgrade
from tests.conftest import git
from tests.e2e.helpers import (
    kill_worker,
    merlin,
    merlin_env,
    start_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e

ONE_SLOW_STEP = """\
title: One slow step
steps:
  - id: slow
    step_type: Feature
    description: add double(x) with a test
    exit_command: test -f double.py
"""


def _paid_first_call(db: Database, job_id: str) -> bool:
    """The attempt's first model call is journaled: its tool (a sleep) is running now."""
    with db.reader() as session:
        return bool(session.scalars(select(LlmCall.id).where(LlmCall.job_id == job_id)).first())


def _left(home: Path, job_id: str) -> tuple[list[str], list[str]]:
    """The job's worktree folders on a machine, and the worktrees its caches register."""
    folder = home / "worktrees" / job_id
    folders = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    registered = []
    for cache in sorted((home / "repos").glob("*.git")):
        listing = git(cache, "worktree", "list", "--porcelain").splitlines()
        registered += [line for line in listing if line.startswith("worktree ")][1:]
    if folder.is_dir():
        folders.insert(0, str(folder))
    return folders, registered


def test_no_worktree_is_left_on_either_machine_after_a_kill(
    tmp_path: Path, py_repo: Path, redis_url: str, postgres_url: str
) -> None:
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(bare))
    url = f"file://{bare}"
    db = Database(postgres_url)
    upgrade(db)
    shared = {"MERLIN_BROKER_URL": redis_url, "MERLIN_DATABASE_URL": postgres_url}
    home_a, home_b = tmp_path / "machine-a", tmp_path / "machine-b"
    env_a, env_b = merlin_env(home_a, **shared), merlin_env(home_b, **shared)
    tasklist, config = write_job_files(
        tmp_path / "job", tasklist=ONE_SLOW_STEP, sleep_seconds=2, lease_seconds=2
    )
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    roles = ("--queues", "llm,control", "--pool", "threads")
    llm_a = start_worker(env_a, log_a, *roles, cwd=tmp_path / "a")
    workers = [llm_a, start_worker(env_a, log_a, "--queues", "verify", cwd=tmp_path / "a")]
    try:
        submitted = merlin(
            env_a, "submit", str(tasklist), "--repo", url, "--config", str(config), "--json"
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = json.loads(submitted.stdout)["job_id"]
        wait_for(lambda: _paid_first_call(db, job_id), 30, "machine A's attempt to start")
        kill_worker(llm_a)
        # A's attempt is left on A's disk and registered in A's cache.
        folders, registered = _left(home_a, job_id)
        assert len(registered) == 1
        assert registered[0].startswith(f"worktree {home_a}")
        assert len(folders) == 2
        assert folders[1].startswith("slow-1-")

        workers.append(start_worker(env_b, log_b, *roles, cwd=tmp_path / "b"))
        wait_for(lambda: job_view(db, job_id)["finished_at"], 40, "machine B to finish the job")
        logs = log_a.read_text()[-3000:] + log_b.read_text()[-3000:]
        view = job_view(db, job_id)
        assert view["status"] == "completed", logs
        assert [s["recoveries"] for s in view["steps"]] == [1]
        assert "Task merlin.finalize[" in log_b.read_text()  # B ended the job...
        assert _left(home_b, job_id) == ([], [])  # ... and cleared its own worktrees then

        # A's surviving worker clears A within a few sweeps (MERLIN_SWEEP_INTERVAL=1).
        wait_for(lambda: _left(home_a, job_id) == ([], []), 10, "machine A's sweep", poll=0.1)
    finally:
        for worker in workers:
            kill_worker(worker)  # their work is done; a warm shutdown only costs time
        db.dispose()
    assert _left(home_a, job_id) == _left(home_b, job_id) == ([], [])
    assert not (home_a / "worktrees" / job_id).exists()
    assert git(bare, "show", f"merlin/{job_id}:double.py").startswith("def double")
