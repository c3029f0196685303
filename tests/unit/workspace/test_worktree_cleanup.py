"""Leftover worktrees of ended jobs, cleared on real git repositories, caches and SQLite."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.errors import GitError
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, utcnow
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.workspace import worktree_cleanup
from merlin_flow.workspace.environment import _locked, setup_checkouts
from merlin_flow.workspace.git import add_worktree
from merlin_flow.workspace.repository import cache_path
from merlin_flow.workspace.worktree_cleanup import (
    UNKNOWN_AFTER,
    clear_ended,
    clear_setups,
    leftovers,
)
from tests.conftest import git
from tests.unit.scripted_jobs import ONE_STEP, scripted_job


def url_job(db: Database, settings: Settings, py_repo: Path, tmp_path: Path) -> tuple[str, Path]:
    """A job on a ``file://`` URL; returns its id and this machine's cache of the URL."""
    remote = tmp_path / "remote.git"
    if not remote.exists():
        git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(remote))
    script = tmp_path / "script.yaml"
    script.write_text("rules: []\n")
    config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
    url = f"file://{remote}"
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), url, config)
    return job_id, cache_path(url, settings)


def killed_attempt(repo: Path, settings: Settings, job_id: str, name: str = "s0-1-dead") -> Path:
    """The worktree a worker killed mid-attempt leaves: on disk and registered in ``repo``."""
    base = git(repo, "rev-parse", "HEAD")
    worktree = add_worktree(repo, settings.worktrees_dir / job_id / name, base)
    (worktree / "half-done.py").write_text("# the agent was here\n")
    return worktree


def finish(db: Database, job_id: str, status: JobStatus = JobStatus.COMPLETED) -> None:
    with db.session() as session:
        job = session.get_one(Job, job_id)
        job.status = status
        job.finished_at = utcnow()


def registered(repo: Path) -> list[str]:
    """The worktrees git lists in ``repo``, but the repository itself."""
    lines = git(repo, "worktree", "list", "--porcelain").splitlines()
    paths = [line.removeprefix("worktree ") for line in lines if line.startswith("worktree ")]
    return paths[1:]


def age(folder: Path, seconds: float) -> None:
    """Make ``folder`` and its entries look unchanged for ``seconds``."""
    then = time.time() - seconds
    for path in (folder, *folder.iterdir()):
        os.utime(path, (then, then), follow_symlinks=False)


def test_a_finished_jobs_worktrees_leave_the_folder_and_the_cache(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id, cache = url_job(db, settings, py_repo, tmp_path)
    kept = killed_attempt(cache, settings, job_id, "s0-1-dead")
    gone = killed_attempt(cache, settings, job_id, "s0-1-verify-dead")
    shutil.rmtree(gone)  # its folder was removed, its registration was not
    assert len(registered(cache)) == 2
    finish(db, job_id, JobStatus.FAILED)

    assert clear_ended(db, settings) == [job_id]

    assert not kept.exists()
    assert not (settings.worktrees_dir / job_id).exists()
    assert registered(cache) == []
    assert clear_ended(db, settings) == []  # nothing left: nothing done


def test_an_empty_folder_of_a_finished_job_goes(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """What every machine that worked on a job but did not finalize it keeps."""
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    (settings.worktrees_dir / job_id).mkdir(parents=True)
    finish(db, job_id)

    assert clear_ended(db, settings) == [job_id]
    assert list(settings.worktrees_dir.iterdir()) == []


@pytest.mark.parametrize(
    "status", [JobStatus.PENDING, JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.COMPLETED]
)
def test_a_job_that_has_not_finished_is_never_touched(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path, status: JobStatus
) -> None:
    """Not finalized yet: a final status alone (cancelled while a step runs) is not enough."""
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    worktree = killed_attempt(py_repo, settings, job_id)
    with db.session() as session:
        session.get_one(Job, job_id).status = status
    age(worktree.parent, 10 * UNKNOWN_AFTER)

    assert clear_ended(db, settings) == []

    assert (worktree / "half-done.py").is_file()
    assert registered(py_repo) == [str(worktree)]


def test_a_folder_the_store_does_not_know_goes_once_unchanged_for_an_hour(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    worktree = killed_attempt(py_repo, settings, "0123456789ab")
    # The user's own worktree on a disk that is not mounted now: git may not forget it.
    users = tmp_users = py_repo.parent / "on-a-usb-disk"
    git(py_repo, "worktree", "add", "-q", "--detach", str(users))
    shutil.rmtree(tmp_users)

    assert clear_ended(db, settings) == []  # changed just now: maybe another store's job
    assert worktree.is_dir()

    age(worktree.parent, UNKNOWN_AFTER + 60)
    assert clear_ended(db, settings) == ["0123456789ab"]

    assert not worktree.parent.exists()
    # Unregistered from the repository its .git file names; the user's entry stays.
    assert registered(py_repo) == [str(users)]


def test_scratch_worktrees_links_and_other_folders_are_not_job_folders(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    base = git(py_repo, "rev-parse", "HEAD")
    scratch = add_worktree(py_repo, settings.worktrees_dir / "files-0a1b2c3d", base)
    setup = settings.worktrees_dir / "_setup" / "env-1"
    setup.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    (settings.worktrees_dir / "abcdef012345").symlink_to(elsewhere)
    for path in settings.worktrees_dir.iterdir():
        os.utime(path, (1, 1), follow_symlinks=False)

    assert clear_ended(db, settings) == []

    assert (scratch / "app.py").is_file()
    assert setup.is_dir()
    assert (elsewhere / "keep").is_dir()


def test_one_job_that_cannot_be_cleared_does_not_stop_the_others(
    db: Database,
    settings: Settings,
    py_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, fine = (scripted_job(db, settings, py_repo, tmp_path) for _ in range(2))
    stuck = killed_attempt(py_repo, settings, broken)
    killed_attempt(py_repo, settings, fine)
    finish(db, broken)
    finish(db, fine)
    real = worktree_cleanup.remove_worktree

    def failing(repo: Path, path: Path) -> None:
        if path == stuck:
            raise GitError("git worktree remove: Input/output error")
        real(repo, path)

    monkeypatch.setattr(worktree_cleanup, "remove_worktree", failing)

    assert clear_ended(db, settings) == [fine]

    assert not (settings.worktrees_dir / fine).exists()
    assert stuck.is_dir()
    assert f"job {broken}: its worktrees here could not be removed" in caplog.text
    monkeypatch.undo()
    assert clear_ended(db, settings) == [broken]  # the next sweep tries again
    assert registered(py_repo) == []


def test_nothing_to_do_costs_a_listing_and_a_folder_one_query(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    assert leftovers(db, settings, time.time()) == []
    settings.worktrees_dir.mkdir(parents=True)
    assert leftovers(db, settings, time.time()) == []
    assert statements == []  # no job folder: no query
    running = [scripted_job(db, settings, py_repo, tmp_path) for _ in range(3)]
    for job_id in running:
        killed_attempt(py_repo, settings, job_id)
    statements.clear()

    assert leftovers(db, settings, time.time()) == []

    queries = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 1, statements  # one query for every folder (and SQLite's BEGIN)
    assert "FROM jobs" in queries[0]


def test_finalize_clears_its_own_machines_folder_and_cache(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id, cache = url_job(db, settings, py_repo, tmp_path)
    worktree = killed_attempt(cache, settings, job_id)
    shutil.rmtree(killed_attempt(cache, settings, job_id, "s0-2-dead"))
    with db.session() as session:
        session.get_one(Job, job_id).status = JobStatus.CANCELLED

    assert finalize_job(db, settings, job_id) == JobStatus.CANCELLED

    assert not worktree.parent.exists()
    assert registered(cache) == []


def test_every_workers_sweep_clears_and_its_failure_stops_no_sweep(
    db: Database,
    settings: Settings,
    py_repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from workers import sweeper

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    worktree = killed_attempt(py_repo, settings, job_id)
    finish(db, job_id)

    assert sweeper.run_sweep(db, settings) == []
    assert not worktree.parent.exists()

    def broken(*_: Any) -> list[str]:
        raise OSError("disk gone")

    monkeypatch.setattr(sweeper, "clear_ended", broken)
    assert sweeper.run_sweep(db, settings) == []
    assert "the worktrees of ended jobs could not be looked at" in caplog.text


def _build_killed_midway(repo: Path, settings: Settings, env: str) -> Path:
    """A real process takes ``env``'s build lock, checks the project out as a build does,
    and is SIGKILLed mid-build; the checkout it leaves."""
    import signal
    import subprocess
    import sys

    checkout = setup_checkouts(settings) / f"{env}-0a1b2c3d"
    program = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from merlin_flow.workspace.environment import _locked\n"
        "from merlin_flow.workspace.git import add_worktree\n"
        "with _locked(Path(sys.argv[1])):\n"
        "    add_worktree(Path(sys.argv[2]), Path(sys.argv[3]), 'HEAD')\n"
        "    print('building', flush=True)\n"
        "    time.sleep(600)\n"
    )
    builder = subprocess.Popen(
        [sys.executable, "-c", program, str(settings.envs_dir / env), str(repo), str(checkout)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert builder.stdout is not None
    assert builder.stdout.readline() == "building\n"
    assert clear_setups(settings) == []  # its build runs: its checkout stays
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    builder.stdout.close()
    return checkout


def test_a_killed_builds_setup_checkout_goes_and_a_running_ones_stays(
    py_repo: Path, settings: Settings
) -> None:
    dead = _build_killed_midway(py_repo, settings, "proj-1111")
    running = add_worktree(py_repo, setup_checkouts(settings) / "proj-2222-1a2b3c4d", "HEAD")
    assert len(registered(py_repo)) == 2
    with _locked(settings.envs_dir / "proj-2222"):  # a build of another key, in this process
        assert clear_setups(settings) == [dead]
    assert not dead.exists()
    assert running.is_dir()
    assert [Path(path).name for path in registered(py_repo)] == [running.name]
    assert clear_setups(settings) == [running]  # its build is over too now
    assert registered(py_repo) == []


def test_a_killed_workers_quarantine_goes_with_its_jobs_folder(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """A worker killed while it staged an attempt leaves its quarantine (objects, an index)."""
    from merlin_flow.workspace.staging import quarantine

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    worktree = killed_attempt(py_repo, settings, job_id)
    held = quarantine(worktree)
    folder = Path(held.__enter__()["GIT_OBJECT_DIRECTORY"]).parent  # never left: killed
    (folder / "objects" / "ab").mkdir()
    (folder / "objects" / "ab" / "cdef").write_bytes(b"an attempt's blob")
    finish(db, job_id)
    assert clear_ended(db, settings) == [job_id]
    assert not folder.exists()
    assert not worktree.parent.exists()
