"""`merlin prune` on real git repositories and SQLite: what it removes, and what it never does."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import InputError
from merlin_flow.jobs.pruning import Kind, parse_age, prune
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings, get_settings
from merlin_flow.store import Database, Job, JobStatus, open_database, utcnow
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.workspace.environment import MARKER_FILE
from merlin_flow.workspace.git import add_worktree
from merlin_flow.workspace.repository import cache_path, repository_of
from tests.conftest import git
from tests.unit.scripted_jobs import ONE_STEP, scripted_job

WEEK = timedelta(days=7)


def end(
    db: Database, job_id: str, status: JobStatus, days_ago: float, head: str | None = None
) -> None:
    """Record the job as ended ``days_ago`` (moving its head to ``head``)."""
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.status = status
        job.finished_at = utcnow() - timedelta(days=days_ago)
        if head is not None:
            job.head_commit = head


def step_commit(repo: Path, job_id: str, text: str) -> str:
    """A commit on merlin/<job> that changes app.py, as a verified step leaves it."""
    worktree = repo.parent / f"wt-{job_id}"
    git(repo, "worktree", "add", "-q", "--detach", str(worktree), f"merlin/{job_id}")
    (worktree / "app.py").write_text(text)
    git(worktree, "commit", "-qam", "step")
    commit = git(worktree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(worktree))
    git(repo, "update-ref", f"refs/heads/merlin/{job_id}", commit)
    return commit


def leftovers(repo: Path, settings: Settings, job_id: str, commit: str) -> Path:
    """What a job's run leaves: two attempt refs, a killed worker's worktree, the job folder."""
    git(repo, "update-ref", f"refs/merlin/{job_id}/s0/1", commit)
    git(repo, "update-ref", f"refs/merlin/{job_id}/s0/2", commit)
    folder = settings.jobs_dir / job_id
    folder.mkdir(parents=True)
    (folder / f"{job_id}.patch").write_text("diff\n")
    (folder / "summary.md").write_text("# job\n")
    return add_worktree(repo, settings.worktrees_dir / job_id / "s0-2-dead", commit)


def ended_job(
    db: Database,
    settings: Settings,
    repo: Path,
    tmp_path: Path,
    status: JobStatus,
    days_ago: float = 10,
    change: bool = True,
) -> tuple[str, str]:
    """A job that ended ``days_ago`` with ``status``, its branch one step ahead (or not)."""
    job_id = scripted_job(db, settings, repo, tmp_path)
    base = git(repo, "rev-parse", "main")
    head = step_commit(repo, job_id, f"# {job_id}\n") if change else base
    leftovers(repo, settings, job_id, head)
    end(db, job_id, status, days_ago, head)
    return job_id, head


def refs(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines())


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def worktrees(repo: Path) -> str:
    return git(repo, "worktree", "list", "--porcelain")


def job_refs(repo: Path, job_id: str) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)", f"refs/merlin/{job_id}/").split()


# --- jobs --------------------------------------------------------------------------------


def test_failed_jobs_lose_branch_refs_worktrees_and_folder_and_nothing_else(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    failed, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    cancelled, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.CANCELLED, change=False)
    broke, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.BUDGET_EXCEEDED)
    completed, kept_head = ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED)
    main = git(py_repo, "rev-parse", "main")
    others = {  # the user's, and merlin's refs that are no job's of the store
        "refs/heads/feature": main,
        "refs/heads/merlin/notes": main,
        "refs/merlin-upstream/HEAD": main,
        "refs/merlin/0123456789ab/s0/1": main,
        f"refs/merlin/{failed}x/s0/1": main,
    }
    for ref, commit in others.items():
        git(py_repo, "update-ref", ref, commit)

    report = prune(db, settings, older_than=WEEK, failed_only=True)

    gone = (failed, cancelled, broke)
    assert sorted(report.of_kind(Kind.BRANCH)) == sorted(f"merlin/{job}" for job in gone)
    assert len(report.of_kind(Kind.ATTEMPT_REF)) == 6
    assert len(report.of_kind(Kind.WORKTREE)) == 3
    assert report.of_kind(Kind.ENV_CACHE) == []  # --failed prunes those jobs only
    assert report.skipped == []
    for job_id in gone:
        assert git(py_repo, "branch", "--list", f"merlin/{job_id}") == ""
        assert job_refs(py_repo, job_id) == []
        assert not (settings.worktrees_dir / job_id).exists()
        assert not (settings.jobs_dir / job_id).exists()
        assert f"/{job_id}/" not in worktrees(py_repo)
    # The completed job is not --failed's business; the rest is not merlin's.
    assert git(py_repo, "rev-parse", f"merlin/{completed}") == kept_head
    assert len(job_refs(py_repo, completed)) == 2
    assert (settings.jobs_dir / completed).is_dir()
    assert {f"{ref} {commit}" for ref, commit in others.items()} <= refs(py_repo)
    assert git(py_repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_by_default_a_completed_branch_and_patch_stay_and_failed_jobs_stay_resumable(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    completed, completed_head = ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED)
    failed, failed_head = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    empty, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED, change=False)

    report = prune(db, settings, older_than=WEEK)

    assert git(py_repo, "rev-parse", f"merlin/{completed}") == completed_head
    assert git(py_repo, "rev-parse", f"merlin/{failed}") == failed_head
    assert (settings.jobs_dir / completed / "summary.md").is_file()
    assert (settings.jobs_dir / failed / "summary.md").is_file()
    for job_id in (completed, failed, empty):
        assert job_refs(py_repo, job_id) == []
        assert not (settings.worktrees_dir / job_id).exists()
    # A completed job that changed nothing has nothing to merge: its branch goes.
    assert report.of_kind(Kind.BRANCH) == [f"merlin/{empty}"]
    assert git(py_repo, "branch", "--list", f"merlin/{empty}") == ""
    assert report.of_kind(Kind.JOB_FOLDER) == [str(settings.jobs_dir / empty)]


def test_pending_running_and_finalizing_jobs_are_never_touched(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    pending = scripted_job(db, settings, py_repo, tmp_path)
    running = scripted_job(db, settings, py_repo, tmp_path)
    finalizing = scripted_job(db, settings, py_repo, tmp_path)
    main = git(py_repo, "rev-parse", "main")
    for job_id in (pending, running, finalizing):
        leftovers(py_repo, settings, job_id, main)
    with db.session() as session:
        job = session.get(Job, running)
        assert job is not None
        job.status = JobStatus.RUNNING
        job = session.get(Job, finalizing)
        assert job is not None
        job.status = JobStatus.CANCELLED  # a worker still holds its step: not finalized
    before = refs(py_repo), files(settings.home_dir), worktrees(py_repo)

    for failed_only in (False, True):
        report = prune(db, settings, older_than=timedelta(0), failed_only=failed_only)
        assert report.removed == []

    assert (refs(py_repo), files(settings.home_dir), worktrees(py_repo)) == before


def test_older_than_counts_from_when_the_job_ended(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED, days_ago=3)

    assert prune(db, settings, older_than=WEEK, failed_only=True).removed == []
    later = utcnow() + timedelta(days=5)
    assert prune(db, settings, older_than=WEEK, failed_only=True, dry_run=True, now=later).removed
    assert len(job_refs(py_repo, job_id)) == 2
    report = prune(db, settings, older_than=parse_age("2d"), failed_only=True)
    assert report.of_kind(Kind.BRANCH) == [f"merlin/{job_id}"]
    assert job_refs(py_repo, job_id) == []


def test_dry_run_removes_nothing_and_lists_what_the_real_run_removes(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED)
    ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED, change=False)
    old_environment(settings, "repo", "a" * 16, days_ago=30)
    unknown_job_folder(py_repo, settings)
    stale_cache_registration(py_repo, settings)
    state = refs(py_repo), files(settings.home_dir), worktrees(py_repo)

    for failed_only in (False, True):
        dry = prune(db, settings, older_than=WEEK, failed_only=failed_only, dry_run=True)
        assert dry.dry_run
        assert dry.removed
        assert (refs(py_repo), files(settings.home_dir), worktrees(py_repo)) == state

    dry = prune(db, settings, older_than=WEEK, dry_run=True)
    real = prune(db, settings, older_than=WEEK)
    assert not real.dry_run
    assert real.removed == dry.removed
    assert {removal.kind for removal in real.removed} == set(Kind)
    assert refs(py_repo) != state[0]


def unknown_job_folder(repo: Path, settings: Settings, job_id: str = "0123456789ab") -> Path:
    """A worktree in the folder of a job the store does not know, unchanged for 30 days."""
    worktree = add_worktree(repo, settings.worktrees_dir / job_id / "s0-1-dead", "main")
    then = time.time() - 30 * 86400
    for path in (worktree.parent, worktree):
        os.utime(path, (then, then))
    return worktree


def stale_cache_registration(repo: Path, settings: Settings) -> tuple[Path, Path]:
    """A cache of this machine registering a worktree whose folder is gone; (cache, path)."""
    cache = settings.home_dir / "repos" / "remote-0123456789ab.git"
    git(repo, "clone", "-q", "--bare", str(repo), str(cache))
    gone = settings.worktrees_dir / "fedcba987654" / "s0-1-gone"
    git(cache, "worktree", "add", "-q", "--detach", str(gone))
    shutil.rmtree(gone.parent)
    return cache, gone


def test_unknown_jobs_folders_and_stale_cache_registrations_go_but_not_with_failed(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    old = unknown_job_folder(py_repo, settings)
    recent = add_worktree(py_repo, settings.worktrees_dir / "ba9876543210" / "s0-1", "main")
    cache, gone = stale_cache_registration(py_repo, settings)
    users = py_repo.parent / "user-worktree"  # the user's, on a disk not mounted now
    git(py_repo, "worktree", "add", "-q", "--detach", str(users))
    shutil.rmtree(users)
    before = worktrees(py_repo), worktrees(cache)

    assert prune(db, settings, older_than=WEEK, failed_only=True).removed == []
    assert (worktrees(py_repo), worktrees(cache)) == before

    report = prune(db, settings, older_than=WEEK)
    assert report.of_kind(Kind.WORKTREE) == [str(old)]
    assert report.of_kind(Kind.WORKTREE_FOLDER) == [str(old.parent)]
    assert report.of_kind(Kind.REGISTRATION) == [str(gone)]
    assert [r.where for r in report.removed] == [str(py_repo), None, str(cache)]
    assert not old.parent.exists()
    assert "s0-1-gone" not in worktrees(cache)
    assert recent.is_dir()  # unknown, but changed within the hour
    assert str(recent) in worktrees(py_repo)
    assert str(users) in worktrees(py_repo)
    assert prune(db, settings, older_than=WEEK).removed == []


def test_a_moved_or_checked_out_branch_is_kept_and_said_so(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    moved, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    user_work = step_commit(py_repo, moved, "# the user's own work on top\n")
    checked_out, head = ended_job(db, settings, py_repo, tmp_path, JobStatus.CANCELLED)
    git(py_repo, "checkout", "-q", f"merlin/{checked_out}")

    report = prune(db, settings, older_than=WEEK, failed_only=True)

    assert report.of_kind(Kind.BRANCH) == []
    assert git(py_repo, "rev-parse", f"merlin/{moved}") == user_work
    assert git(py_repo, "rev-parse", f"merlin/{checked_out}") == head
    reasons = {skipped.target: skipped.reason for skipped in report.skipped}
    assert "moved since the job ended" in reasons[f"merlin/{moved}"]
    assert "checked out in" in reasons[f"merlin/{checked_out}"]
    # The branch stays, and so does the patch describing it; the refs still go.
    assert (settings.jobs_dir / moved).is_dir()
    assert job_refs(py_repo, moved) == job_refs(py_repo, checked_out) == []


def test_a_repository_that_is_gone_is_reported_not_a_crash(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    failed, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    completed, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.COMPLETED)
    shutil.rmtree(py_repo)

    report = prune(db, settings, older_than=WEEK, failed_only=True)

    assert [(s.target, s.reason) for s in report.skipped] == [
        (str(py_repo), "the repository no longer exists: the refs of its jobs are left")
    ]
    assert not (settings.worktrees_dir / failed).exists()
    assert not (settings.jobs_dir / failed).exists()  # its branch went with the repository
    assert (settings.jobs_dir / completed).is_dir()
    report = prune(db, settings, older_than=WEEK)
    assert report.of_kind(Kind.WORKTREE) == [str(settings.worktrees_dir / completed / "s0-2-dead")]
    assert (settings.jobs_dir / completed).is_dir()


def test_a_git_url_job_loses_its_branch_on_the_remote_and_refs_in_the_cache(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(remote))
    url = f"file://{remote}"
    script = tmp_path / "script.yaml"
    script.write_text("rules: []\n")
    config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), url, config)
    base = git(remote, "rev-parse", f"merlin/{job_id}")
    repository_of(url, settings).publish(f"refs/merlin/{job_id}/s0/1", base)
    end(db, job_id, JobStatus.FAILED, days_ago=10)
    cache = cache_path(url, settings)

    report = prune(db, settings, older_than=WEEK, failed_only=True)

    assert report.skipped == []
    assert report.of_kind(Kind.BRANCH) == [f"merlin/{job_id}"]
    assert report.of_kind(Kind.ATTEMPT_REF) == [f"refs/merlin/{job_id}/s0/1"]
    assert git(remote, "branch", "--list", f"merlin/{job_id}") == ""
    assert git(cache, "branch", "--list", f"merlin/{job_id}") == ""
    assert job_refs(cache, job_id) == []
    assert job_refs(remote, job_id) == [f"refs/merlin/{job_id}/s0/1"]  # the cache only


def test_a_job_the_engine_ran_keeps_its_product_and_loses_its_attempt_refs(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.engine.attempt import execute_step
    from merlin_flow.engine.finalize import finalize_job
    from merlin_flow.engine.verdict import verify_step

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    assert finalize_job(db, settings, job_id) == JobStatus.COMPLETED
    head = git(py_repo, "rev-parse", f"merlin/{job_id}")
    assert job_refs(py_repo, job_id) == [f"refs/merlin/{job_id}/s0/1"]
    [environment] = [p for p in settings.envs_dir.iterdir() if p.is_dir()]

    assert prune(db, settings, older_than=WEEK).removed == []  # it ended just now
    report = prune(db, settings, older_than=WEEK, now=utcnow() + 2 * WEEK)

    assert report.of_kind(Kind.ATTEMPT_REF) == [f"refs/merlin/{job_id}/s0/1"]
    assert report.of_kind(Kind.ENV_CACHE) == [str(environment)]
    assert job_refs(py_repo, job_id) == []
    assert git(py_repo, "rev-parse", f"merlin/{job_id}") == head
    assert "return 42" in git(py_repo, "show", f"merlin/{job_id}:app.py")
    assert not environment.exists()
    assert (settings.jobs_dir / job_id / f"{job_id}.patch").is_file()


# --- environments ----------------------------------------------------------------------


def old_environment(settings: Settings, slug: str, key: str, days_ago: float) -> Path:
    """A built environment (marker, setup log and lock file) built ``days_ago``."""
    folder = settings.envs_dir / f"{slug}-{key}"
    (folder / "bin").mkdir(parents=True)
    (folder / MARKER_FILE).write_text("{}\n")
    folder.with_name(folder.name + ".log").write_text("$ uv venv\n")
    folder.with_name(folder.name + ".lock").touch()
    built = time.time() - days_ago * 86400
    os.utime(folder / MARKER_FILE, (built, built))
    return folder


def test_environments_go_when_old_unless_built_now_or_used_by_an_open_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    old = old_environment(settings, "repo", "1" * 16, days_ago=30)
    recent = old_environment(settings, "repo", "2" * 16, days_ago=1)
    locked = old_environment(settings, "repo", "3" * 16, days_ago=30)
    busy_repo = shutil.copytree(py_repo, tmp_path / "busy")
    busy = old_environment(settings, "busy", "4" * 16, days_ago=30)
    scripted_job(db, settings, busy_repo, tmp_path)  # pending: its steps may use `busy`
    not_ours = settings.envs_dir / "notes"
    not_ours.mkdir()
    os.utime(not_ours, (0, 0))

    with locked.with_name(locked.name + ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        dry = prune(db, settings, older_than=WEEK, dry_run=True)
        report = prune(db, settings, older_than=WEEK)

    assert report.of_kind(Kind.ENV_CACHE) == dry.of_kind(Kind.ENV_CACHE) == [str(old)]
    assert not old.exists()
    assert not old.with_name(old.name + ".log").exists()
    assert old.with_name(old.name + ".lock").exists()  # a builder may hold it open
    assert all(folder.is_dir() for folder in (recent, locked, busy, not_ours))
    reasons = {skipped.target: skipped.reason for skipped in report.skipped}
    assert reasons == {
        str(locked): "being built now (its lock is held)",
        str(busy): "a job of its repository is open and may use it",
    }


# --- input and the command line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "age"),
    [("30m", timedelta(minutes=30)), ("12h", timedelta(hours=12)), ("7d", WEEK), ("2w", 2 * WEEK)],
)
def test_parse_age_reads_minutes_hours_days_and_weeks(text: str, age: timedelta) -> None:
    assert parse_age(text) == age


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-1d", "1.5d", "7 days", "9" * 30 + "w"])
def test_parse_age_refuses_anything_else(text: str) -> None:
    with pytest.raises(InputError, match="--older-than") as caught:
        parse_age(text)
    assert caught.value.exit_code == 2


def test_a_negative_age_is_refused(db: Database, settings: Settings) -> None:
    with pytest.raises(InputError):
        prune(db, settings, older_than=-WEEK)


def test_the_command_lists_as_json_removes_and_refuses_bad_ages(
    merlin_home: Path, py_repo: Path, tmp_path: Path
) -> None:
    settings = get_settings()
    db = open_database(settings.database)
    try:
        job_id, _ = ended_job(db, settings, py_repo, tmp_path, JobStatus.FAILED)
    finally:
        db.dispose()
    runner = CliRunner()

    result = runner.invoke(app, ["prune", "--failed", "--older-than", "soon"])
    assert result.exit_code == 2
    assert "--older-than 'soon'" in result.output

    result = runner.invoke(app, ["prune", "--failed", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert listed["dry_run"] is True
    branch = {
        "kind": "branch",
        "target": f"merlin/{job_id}",
        "job_id": job_id,
        "where": str(py_repo),
    }
    assert branch in listed["removed"]
    assert git(py_repo, "rev-parse", f"merlin/{job_id}")

    result = runner.invoke(app, ["prune", "--failed"])
    assert result.exit_code == 0, result.output
    assert "removed" in result.output
    assert git(py_repo, "branch", "--list", f"merlin/{job_id}") == ""
    result = runner.invoke(app, ["prune", "--failed"])
    assert "nothing to prune older than 7d" in result.output
