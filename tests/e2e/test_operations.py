"""`merlin watch`, `cancel` and `resume` end to end, against a real worker process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import git
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

pytestmark = pytest.mark.e2e


def test_cancel_a_running_job_then_resume_it(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home", COLUMNS="200")
    # Step "slow" runs `sleep 3` as its first tool call: the job is cancelled meanwhile.
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=3)
    log = tmp_path / "worker.log"
    worker = start_worker(env, log)
    try:
        submitted = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
        )
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        watcher = subprocess.Popen(
            [*MERLIN, "watch", job_id], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

        def slow_is_running() -> bool:
            steps = {s["id"]: s for s in status_json(env, job_id)["steps"]}
            return any(a["status"] == "running" for a in steps["slow"]["attempts"])

        wait_for(slow_is_running, 90, "step 'slow' to start its attempt")
        cancelled = merlin(env, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"job {job_id} cancelled" in cancelled.stdout
        out, err = watcher.communicate(timeout=60)
        # watch follows the job to its end, and exits 1: the job did not complete.
        assert watcher.returncode == 1, err
        assert "step fix passed" in out
        assert f"job {job_id} cancelled" in out
        view = status_json(env, job_id)
        assert view["status"] == "cancelled"
        assert view["finished_at"] is not None
        steps = {s["id"]: s for s in view["steps"]}
        assert steps["fix"]["status"] == "Completed"
        assert steps["slow"]["status"] == "Skipped"
        assert [a["status"] for a in steps["slow"]["attempts"]] == ["cancelled"]
        assert steps["docs"]["status"] == "Skipped"
        assert steps["docs"]["attempts"] == []
        # Only the verified step is on the branch; no worktree is left behind.
        assert len(git(py_repo, "rev-list", f"main..merlin/{job_id}").splitlines()) == 1
        assert not (tmp_path / "home" / "worktrees" / job_id).exists()
        again = merlin(env, "cancel", job_id)
        assert again.returncode == 2
        assert "already ended (cancelled)" in again.stderr

        resumed = merlin(env, "resume", job_id, "--wait", "--json", timeout=180)
        assert resumed.returncode == 0, resumed.stderr + log.read_text()[-3000:]
    finally:
        stop_worker(worker)
    view = json.loads(resumed.stdout)
    assert view["status"] == "completed"
    steps = {s["id"]: s for s in view["steps"]}
    assert [a["status"] for a in steps["fix"]["attempts"]] == ["passed"]  # not run again
    assert [a["status"] for a in steps["slow"]["attempts"]] == ["cancelled", "passed"]
    assert [a["status"] for a in steps["docs"]["attempts"]] == ["passed"]
    assert len(git(py_repo, "rev-list", f"main..merlin/{job_id}").splitlines()) == 3
    again = merlin(env, "resume", job_id)
    assert again.returncode == 2
    assert (
        "only a failed, cancelled, budget_exceeded, parked or partially_completed job"
        in again.stderr
    )


def test_cancel_a_job_no_worker_has_started(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    submitted = merlin(
        env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
    )
    job_id = submitted.stdout.strip()
    assert merlin(env, "cancel", job_id).returncode == 0
    view = status_json(env, job_id)
    assert view["status"] == "cancelled"
    assert view["finished_at"] is not None  # nobody works on it: closed at once
    assert [s["status"] for s in view["steps"]] == ["Skipped"] * 3
    watched = merlin(env, "watch", job_id)
    assert watched.returncode == 1
    assert "cancelled" in watched.stdout
    assert merlin(env, "watch", "nosuchjob").returncode == 2
    assert merlin(env, "resume", job_id, "--tier", "nosuchtier").returncode == 2
    # The queued messages of the cancelled job do nothing when a worker comes.
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        resumed = merlin(env, "resume", job_id, "--tier", "premium", "--wait", "--json")
    finally:
        stop_worker(worker)
    # premium.yaml of write_job_files has no rules: the first step fails on premium.
    view = json.loads(resumed.stdout)
    assert resumed.returncode == 1
    assert view["status"] == "failed"
    assert [a["tier"] for a in view["steps"][0]["attempts"]] == ["premium", "premium"]
