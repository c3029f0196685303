"""Ctrl-C in `merlin run` and `merlin submit --wait`: the job is cancelled or detached, said so."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

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

pytestmark = pytest.mark.e2e


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*MERLIN, *args],
        env=env,
        stdin=subprocess.DEVNULL,  # not a terminal: nobody to ask
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _job_id_when_slow_step_runs(env: dict[str, str]) -> str:
    """The id of the only job, once its step `slow` has an attempt running."""

    def running() -> str | None:
        listing = merlin(env, "list", "--json")
        jobs = json.loads(listing.stdout or "[]")
        if not jobs:
            return None
        view = status_json(env, jobs[0]["id"])
        slow = next(s for s in view["steps"] if s["id"] == "slow")
        return str(view["id"]) if slow["attempts"] else None

    job_id: str = wait_for(running, 90, "step slow to start")
    return job_id


def _interrupt(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=90)
    return process.returncode, out, err


def test_ctrl_c_in_run_cancels_the_job_when_nobody_can_be_asked(
    tmp_path: Path, py_repo: Path
) -> None:
    env = merlin_env(tmp_path / "home")
    # Long enough that the step still runs when the signal comes, on a loaded machine
    # where each `merlin status` of the wait takes seconds; the cancel waits it out.
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=10)
    process = _start(env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config))
    job_id = _job_id_when_slow_step_runs(env)

    code, out, err = _interrupt(process)

    assert code == 130, (out, err)
    assert f"interrupted: job {job_id} cancelled" in err, (out, err)
    assert f"job {job_id} cancelled; branch merlin/{job_id} kept as it was" in err
    view = status_json(env, job_id)
    assert view["status"] == "cancelled"
    assert view["finished_at"] is not None
    slow = next(s for s in view["steps"] if s["id"] == "slow")
    assert slow["status"] != "completed"
    assert [s["status"] for s in view["steps"] if s["id"] == "docs"] == ["Skipped"]


def test_ctrl_c_in_run_with_detach_leaves_the_job_to_a_worker(
    tmp_path: Path, py_repo: Path
) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=3, lease_seconds=3)
    process = _start(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config),
        "--on-interrupt", "detach",
    )  # fmt: skip
    job_id = _job_id_when_slow_step_runs(env)

    code, _, err = _interrupt(process)

    assert code == 130
    assert f"job {job_id} detached and still running" in err
    assert f"merlin watch {job_id}" in err
    assert f"merlin cancel {job_id}" in err
    assert status_json(env, job_id)["finished_at"] is None
    # A worker on the same MERLIN_HOME takes the job over once the lease lapses.
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        view = wait_for(
            lambda: (v := status_json(env, job_id))["finished_at"] and v, 120, "the job to end"
        )
    finally:
        stop_worker(worker)
    assert view["status"] == "completed"


def test_ctrl_c_in_submit_wait_stops_waiting_and_says_the_job_goes_on(
    tmp_path: Path, py_repo: Path
) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=0.1)
    # No worker: the job waits in the queue, and so does `submit --wait`.
    process = _start(
        env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--wait"
    )
    assert process.stdout is not None
    job_id = process.stdout.readline().strip()
    assert process.stderr is not None
    assert "no worker has served any of merlin's queues" in process.stderr.readline()

    code, _, err = _interrupt(process)

    assert code == 130
    assert f"stopped waiting; job {job_id} goes on with the workers" in err
    assert status_json(env, job_id)["status"] == "pending"
    assert merlin(env, "cancel", job_id).returncode == 0
