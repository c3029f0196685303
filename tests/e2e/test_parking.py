"""A job merlin's own machinery cannot run is parked, never failed, and goes on afterwards.

A real worker that finds less than ``MERLIN_MIN_FREE_MB`` free under its MERLIN_HOME
parks the job, waiting for space; a worker that has the space resumes it by itself at
its next sweep, and the job completes with every step on the tier it had.
"""

from __future__ import annotations

import json
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


def test_a_job_parked_for_space_resumes_once_space_returns(tmp_path: Path, py_repo: Path) -> None:
    home = tmp_path / "home"
    tasklist, config = write_job_files(tmp_path / "job")
    full = merlin_env(home, MERLIN_MIN_FREE_MB="1e12", COLUMNS="200")  # more than any disk
    submitted = merlin(
        full, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    worker = start_worker(full, tmp_path / "full.log")
    try:
        view = wait_for(
            lambda: (v := status_json(full, job_id))["status"] == "parked" and v, 90, "the park"
        )
    finally:
        stop_worker(worker)
    parked = [s for s in view["steps"] if s["status"] == "Parked"]
    assert [s["id"] for s in parked] == ["fix"]
    assert "waiting for space" in view["error"]
    assert "MERLIN_MIN_FREE_MB" in view["error"]
    assert all(a["status"] != "error" for a in parked[0]["attempts"])  # no attempt failed
    shown = merlin(full, "status", job_id)
    assert "parked" in shown.stdout
    lines = merlin(full, "logs", job_id, "--follow", "--json").stdout.splitlines()
    events = [json.loads(line) for line in lines if '"type": "event"' in line]
    assert [e["data"] for e in events if e["kind"] == "job_parked"] == [
        {"trouble": "no_space", "tries": 1}
    ]

    roomy = merlin_env(home)
    worker = start_worker(roomy, tmp_path / "roomy.log")
    try:
        done = wait_for(
            lambda: (v := status_json(roomy, job_id))["finished_at"] and v["status"] != "parked"
            and v, 120, "the job to resume and finish",
        )  # fmt: skip
    finally:
        stop_worker(worker)
    assert done["status"] == "completed", done["error"]
    assert "space is back: resumed jobs" in (tmp_path / "roomy.log").read_text()
    tiers = {s["id"]: {a["tier"] for a in s["attempts"]} for s in done["steps"]}
    assert tiers["fix"] == {"local"}  # parked is not failed: no escalation
