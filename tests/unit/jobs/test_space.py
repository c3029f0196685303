"""A job waiting for disk space, as `status` (text and `--json`) and `list` show it.

Issue 45: during a full disk `merlin status JOB` showed `running` (or `parked`, with the
error alone) and no word of the wait. No disk is filled here: ``MERLIN_MIN_FREE_MB``
above what any disk has makes MERLIN_HOME's "full", as the tasks' own check reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.cli.common import state
from merlin_flow.engine.lifecycle import start_job
from merlin_flow.engine.machinery import Trouble, park_job
from merlin_flow.jobs.space import list_waiting, space_line, space_view
from merlin_flow.jobs.views import list_jobs
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus
from tests.unit.scripted_jobs import scripted_job

FULL = "1e12"
"""MERLIN_MIN_FREE_MB no disk has free: MERLIN_HOME's disk is full for merlin."""


def _running(db: Database, settings: Settings, repo: Path, tmp_path: Path) -> str:
    job_id = scripted_job(db, settings, repo, tmp_path)
    with db.session() as session:
        start_job(session, session.get_one(Job, job_id), sandboxed=True)
    return job_id


def _parked(db: Database, settings: Settings, repo: Path, tmp_path: Path, trouble: Trouble) -> str:
    job_id = scripted_job(db, settings, repo, tmp_path)
    reason = "DiskFull: no space left" if trouble is Trouble.NO_SPACE else "KeyError: 'x'"
    assert park_job(db, settings, job_id, "s0", "w:1", trouble, reason, 1)
    return job_id


def test_a_running_job_waits_while_the_disk_of_merlin_home_is_full(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    full = Settings(home=tmp_path / "home", min_free_mb=float(FULL))
    job_id = _running(db, full, py_repo, tmp_path)
    space = space_view(db, full, job_id, JobStatus.RUNNING)
    assert space is not None
    assert (space["parked"], space["parked_at"], space["full"]) == (False, None, True)
    assert space["home"] == str(tmp_path / "home")
    assert space["needed_mb"] == 1e12
    assert space["free_mb"] is not None
    assert 0 <= space["free_mb"] < 1e12
    line = space_line(space)
    assert line.startswith(f"waiting for space: the disk of MERLIN_HOME ({tmp_path / 'home'})")
    assert "is full: " in line
    assert "MB free, 1e+12 MB needed (MERLIN_MIN_FREE_MB)" in line
    assert line.endswith("the job goes on by itself once 1e+12 MB are free")
    # With space, a running job waits for nothing; nor does an ended one on a full disk.
    roomy = Settings(home=tmp_path / "home", min_free_mb=0)
    assert space_view(db, roomy, job_id, JobStatus.RUNNING) is None
    assert space_view(db, full, job_id, JobStatus.COMPLETED) is None


def test_a_job_parked_for_space_waits_until_a_sweep_resumes_it(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    full = Settings(home=tmp_path / "home", min_free_mb=float(FULL))
    job_id = _parked(db, full, py_repo, tmp_path, Trouble.NO_SPACE)
    space = space_view(db, full, job_id, JobStatus.PARKED)
    assert space is not None
    assert (space["parked"], space["full"]) == (True, True)
    assert space["parked_at"] is not None
    assert space["parked_at"].endswith("Z")
    line = space_line(space)
    assert line.startswith(f"waiting for space: parked for want of space at {space['parked_at']}")
    assert line.endswith("a worker's sweep resumes it once 1e+12 MB are free")
    back = space_view(db, Settings(home=tmp_path / "home"), job_id, JobStatus.PARKED)
    assert back is not None
    assert (back["parked"], back["full"]) == (True, False)
    assert "MB are free again under MERLIN_HOME" in space_line(back)
    assert space_line(back).endswith("a worker's sweep resumes it at its next sweep")


def test_a_job_parked_for_another_trouble_does_not_wait_for_space(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    full = Settings(home=tmp_path / "home", min_free_mb=float(FULL))
    job_id = _parked(db, full, py_repo, tmp_path, Trouble.INTERNAL)
    assert space_view(db, full, job_id, JobStatus.PARKED) is None


def test_list_marks_the_jobs_waiting_for_space(db: Database, py_repo: Path, tmp_path: Path) -> None:
    roomy = Settings(home=tmp_path / "home", min_free_mb=0)
    parked = _parked(db, roomy, py_repo, tmp_path, Trouble.NO_SPACE)
    other = _parked(db, roomy, py_repo, tmp_path, Trouble.INTERNAL)
    running = _running(db, roomy, py_repo, tmp_path)
    listed, full = list_waiting(db, roomy, list_jobs(db))
    assert {job["id"]: job["waiting_for_space"] for job in listed} == {
        parked: True, other: False, running: False,
    }  # fmt: skip
    assert full is None
    on_a_full_disk = Settings(home=tmp_path / "home", min_free_mb=float(FULL))
    listed, full = list_waiting(db, on_a_full_disk, list_jobs(db))
    assert {job["id"]: job["waiting_for_space"] for job in listed} == {
        parked: True, other: False, running: True,
    }  # fmt: skip
    assert full is not None


@pytest.fixture
def full_home(merlin_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """MERLIN_HOME, full for merlin: MERLIN_MIN_FREE_MB above what its disk has free."""
    monkeypatch.setenv("MERLIN_MIN_FREE_MB", FULL)
    return merlin_home


def test_status_of_a_running_job_on_a_full_disk_says_so(
    full_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    settings, db = state()
    job_id = _running(db, settings, py_repo, tmp_path)
    text = CliRunner().invoke(app, ["status", job_id])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id} · t · running · waiting for space · $"), lines[0]
    [line] = [line for line in lines if line.startswith("waiting for space: ")]
    assert f"the disk of MERLIN_HOME ({full_home}) is full: " in line
    assert "1e+12 MB needed (MERLIN_MIN_FREE_MB)" in line
    shown = CliRunner().invoke(app, ["status", job_id, "--json"])
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.stdout)
    assert view["status"] == "running"
    assert view["space"]["parked"] is False
    assert view["space"]["full"] is True
    assert view["space"]["home"] == str(full_home)
    assert view["space"]["needed_mb"] == 1e12


def test_status_of_a_job_parked_for_space_says_what_it_waits_for(
    full_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    settings, db = state()
    job_id = _parked(db, settings, py_repo, tmp_path, Trouble.NO_SPACE)
    text = CliRunner().invoke(app, ["status", job_id])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id} · t · parked · waiting for space · $"), lines[0]
    [line] = [line for line in lines if line.startswith("waiting for space: ")]
    assert line.startswith("waiting for space: parked for want of space at ")
    assert line.endswith("a worker's sweep resumes it once 1e+12 MB are free")
    view = json.loads(CliRunner().invoke(app, ["status", job_id, "--json"]).stdout)
    assert (view["status"], view["space"]["parked"], view["space"]["full"]) == (
        "parked", True, True,
    )  # fmt: skip


def test_status_and_list_of_a_job_waiting_for_nothing_say_nothing_of_space(
    merlin_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    settings, db = state()
    job_id = _running(db, settings, py_repo, tmp_path)
    text = CliRunner().invoke(app, ["status", job_id])
    assert text.exit_code == 0, text.output
    assert "space" not in text.stdout
    assert json.loads(CliRunner().invoke(app, ["status", job_id, "--json"]).stdout)["space"] is None
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"]).stdout)
    assert [(job["id"], job["waiting_for_space"]) for job in listed] == [(job_id, False)]


def test_list_on_a_full_disk_marks_the_waiting_jobs_and_says_why(
    full_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    settings, db = state()
    parked = _parked(db, settings, py_repo, tmp_path, Trouble.NO_SPACE)
    table = CliRunner().invoke(app, ["list"])
    assert table.exit_code == 0, table.output
    [row] = [line for line in table.stdout.splitlines() if parked in line]
    assert "parked · waiting for space" in row
    note = " ".join(table.stdout.split())
    assert f"the disk of MERLIN_HOME ({full_home}) is full: " in note
    assert "jobs wait for space and go on by themselves once it is freed" in note
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"]).stdout)
    assert [(job["id"], job["waiting_for_space"]) for job in listed] == [(parked, True)]
