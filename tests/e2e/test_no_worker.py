"""Nothing waits in silence: submit, status and --wait say when no worker serves the queues."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import (
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e
NOTICE = "no worker has served any of merlin's queues in the last 30 s"


def test_submit_and_status_say_no_worker_serves_the_queues_until_one_does(
    tmp_path: Path, py_repo: Path
) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    args = ["submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)]

    submitted = merlin(env, *args)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert NOTICE in submitted.stderr
    assert "`merlin worker`" in submitted.stderr
    status = merlin(env, "status", job_id)
    assert NOTICE in status.stdout

    worker = start_worker(env, tmp_path / "worker.log")
    try:
        wait_for(lambda: NOTICE not in merlin(env, "status", job_id).stdout, 60, "a beat")
        again = merlin(env, *args)
        assert again.returncode == 0
        assert NOTICE not in again.stderr
        for job in (job_id, again.stdout.strip()):
            wait_for(lambda j=job: status_json(env, j)["finished_at"], 120, "the job to end")
    finally:
        stop_worker(worker)
    # The worker left: its beat went with it, and a finished job needs no notice.
    assert NOTICE not in merlin(env, "status", job_id).stdout
    assert NOTICE in merlin(env, *args).stderr
