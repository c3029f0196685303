"""Job repositories given as git URLs: caches per machine, refs pushed and fetched.

Two ``Settings`` with different homes stand for two machines; a bare repository reached
by a ``file://`` URL stands for the remote. Everything is real git.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from merlin_flow.config import load_config
from merlin_flow.errors import GitError, RemoteUnavailable, RepositoryError
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Job, open_database
from merlin_flow.tasklist import TaskList
from merlin_flow.workspace import git_repair, repository
from merlin_flow.workspace.git import add_worktree, attempt_ref, commit_all, remove_worktree
from merlin_flow.workspace.repository import (
    cache_path,
    is_git_url,
    repository_for_input,
    repository_of,
)
from tests.conftest import git


@pytest.fixture
def remote(tmp_path: Path, py_repo: Path) -> str:
    """A bare copy of py_repo, reached by a file:// URL."""
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(bare))
    return f"file://{bare}"


def _machine(tmp_path: Path, name: str) -> Settings:
    return Settings(home=tmp_path / name)


def _remote_ref(url: str, ref: str) -> str:
    bare = Path(url.removeprefix("file://"))
    return git(bare, "rev-parse", "--verify", "--quiet", ref)


def _commit_on(source: repository.JobRepository, start: str, name: str, text: str) -> str:
    """Make a commit on top of ``start`` in a worktree of ``source``, as a step does."""
    worktree = source.scratch / f"make-{name}"
    add_worktree(source.path, worktree, start)
    try:
        (worktree / name).write_text(text)
        return commit_all(worktree, f"add {name}", source.scratch / "excludes")
    finally:
        remove_worktree(source.path, worktree)


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://github.com/org/repo.git", True),
        ("ssh://git@host:22/org/repo", True),
        ("file:///srv/git/repo.git", True),
        ("git@github.com:org/repo.git", True),
        ("/home/me/repo", False),
        ("relative/repo", False),
        (".", False),
        ("folder:with:colons", False),
        ("-oProxyCommand=evil@host:path", False),
        ("--upload-pack=touch@host:x", False),
    ],
)
def test_git_urls_are_told_from_paths(location: str, expected: bool) -> None:
    assert is_git_url(location) is expected


def test_each_url_gets_its_own_readably_named_cache(tmp_path: Path) -> None:
    settings = _machine(tmp_path, "m")
    one = cache_path("https://github.com/org/service.git", settings)
    other = cache_path("https://gitlab.com/org/service.git", settings)
    assert one.name.startswith("service-")
    assert one.name.endswith(".git")
    assert one != other
    assert one.parent == settings.home_dir / "repos"


@pytest.mark.parametrize(
    "url",
    [
        "https://bot:s3cret@example.com/org/repo.git",
        "https://s3cret@example.com/org/repo.git",  # a token as the user name
        "ssh://git:s3cret@example.com/org/repo.git",
        "https://bot:s3cret@example.com:notaport/org/repo.git",
    ],
)
def test_a_url_with_credentials_is_refused_without_echoing_them(tmp_path: Path, url: str) -> None:
    with pytest.raises(RepositoryError) as caught:
        repository_for_input(url, _machine(tmp_path, "m"))
    assert "s3cret" not in str(caught.value)
    assert "credential helper" in str(caught.value)


def test_a_url_that_cannot_be_cloned_is_an_input_error_and_leaves_no_cache(
    tmp_path: Path,
) -> None:
    settings = _machine(tmp_path, "m")
    url = f"file://{tmp_path / 'nowhere.git'}"
    with pytest.raises(RepositoryError, match="cannot clone"):
        repository_for_input(url, settings)
    leftovers = [p.name for p in (settings.home_dir / "repos").iterdir()]
    assert all(name.endswith(".lock") for name in leftovers), leftovers


def test_commits_travel_between_two_machines_through_the_remote(
    tmp_path: Path, remote: str, py_repo: Path
) -> None:
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    two = repository_of(remote, _machine(tmp_path, "two"))
    assert one.path != two.path
    assert one.url == two.url == remote
    base = one.base_commit()
    assert base == git(py_repo, "rev-parse", "HEAD")

    one.start_branch("merlin/j1", base)
    assert _remote_ref(remote, "refs/heads/merlin/j1") == base
    with pytest.raises(GitError):  # a job branch is created once
        one.start_branch("merlin/j1", base)

    # Machine one makes an attempt and publishes it; machine two fetches it by the job.
    commit = _commit_on(one, base, "notes.txt", "from machine one\n")
    one.publish(attempt_ref("j1", "s1", 1), commit)
    assert _remote_ref(remote, attempt_ref("j1", "s1", 1)) == commit
    two.have("j1", commit)
    assert git(two.path, "show", f"{commit}:notes.txt") == "from machine one"

    # Machine two passes it: compare-and-swap on the remote branch.
    assert two.advance("merlin/j1", commit, base)
    assert _remote_ref(remote, "refs/heads/merlin/j1") == commit
    assert one.branch_head("merlin/j1") == commit
    # Machine one, still expecting the old head, is refused: nothing is overwritten.
    other = _commit_on(one, base, "other.txt", "late\n")
    assert not one.advance("merlin/j1", other, base)
    assert _remote_ref(remote, "refs/heads/merlin/j1") == commit

    one.drop_branch("merlin/j1")
    assert one.branch_head("merlin/j1") is None


def test_a_commit_the_remote_never_had_is_a_git_error(tmp_path: Path, remote: str) -> None:
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    base = one.base_commit()
    one.start_branch("merlin/j2", base)
    unpublished = _commit_on(one, base, "x.txt", "x\n")
    two = repository_of(remote, _machine(tmp_path, "two"))
    with pytest.raises(GitError, match=unpublished[:10]):
        two.have("j2", unpublished)


def test_a_remote_that_does_not_answer_is_retried_then_reported_as_unavailable(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repository, "RETRY_DELAYS", (0.0, 0.0))
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    base = one.base_commit()
    commit = _commit_on(one, base, "y.txt", "y\n")
    # The same cache, while its server refuses connections.
    down = replace(one, url="http://127.0.0.1:1/remote.git")
    with pytest.raises(RemoteUnavailable, match="3 tries"):
        down.publish(attempt_ref("j3", "s1", 1), commit)
    with pytest.raises(RemoteUnavailable, match="3 tries"):
        repository_of("http://127.0.0.1:1/other.git", _machine(tmp_path, "fresh"))  # a clone
    assert not list((tmp_path / "fresh" / "repos").glob("*.partial"))


def test_a_fetch_missing_objects_is_tried_again(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen 0.1 s after a worker on another machine was killed while it pushed.
    monkeypatch.setattr(repository, "RETRY_DELAYS", (0.0, 0.0))
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    base = one.base_commit()
    one.start_branch("merlin/j5", base)
    commit = _commit_on(one, base, "z.txt", "z\n")
    one.publish(attempt_ref("j5", "s1", 1), commit)
    two = repository_of(remote, _machine(tmp_path, "two"))
    once, tries = repository._once, []

    def broken_first(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        tries.append(args[0])
        if len(tries) == 1:
            return subprocess.CompletedProcess(
                args, 128, "", "fatal: remote did not send all necessary objects\n"
            )
        return once(args, cwd)

    monkeypatch.setattr(repository, "_once", broken_first)
    two.have("j5", commit)
    assert tries == ["fetch", "fetch"]


def test_a_remote_that_refuses_is_a_git_error_at_once(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries: list[list[str]] = []
    once = repository._once

    def counted(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        tries.append(args)
        return once(args, cwd)

    monkeypatch.setattr(repository, "_once", counted)
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    base = one.base_commit()
    commit = _commit_on(one, base, "y.txt", "y\n")
    shutil.rmtree(remote.removeprefix("file://"))  # no such repository any more
    tries.clear()
    with pytest.raises(GitError) as caught:
        one.publish(attempt_ref("j4", "s1", 1), commit)
    assert not isinstance(caught.value, RemoteUnavailable)
    assert [args[0] for args in tries] == ["push"]  # tried once, not again


def test_a_job_branch_that_exists_on_the_remote_is_not_taken_over(
    tmp_path: Path, remote: str, py_repo: Path
) -> None:
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    two = repository_for_input(remote, _machine(tmp_path, "two"))
    base = two.base_commit()
    other = _commit_on(two, base, "z.txt", "z\n")
    two.start_branch("merlin/j5", other)
    # Machine one's cache has no such branch, but the remote does: refused, not moved.
    with pytest.raises(GitError, match="exists on"):
        one.start_branch("merlin/j5", base)
    assert _remote_ref(remote, "refs/heads/merlin/j5") == other
    assert git(one.path, "branch", "--list", "merlin/j5") == ""


def test_a_job_on_a_url_records_the_url_and_reads_the_remote_project(
    tmp_path: Path, remote: str, merlin_home: Path, py_repo: Path
) -> None:
    settings = Settings()
    db = open_database(settings.database)
    tasklist = TaskList.model_validate(
        {"title": "t", "steps": [{"id": "s1", "step_type": "Test", "description": "run tests"}]}
    )
    # The work tree of py_repo moves on; the job starts from what the remote has.
    (py_repo / "app.py").write_text("local edit\n")
    job_id = create_job(db, settings, tasklist, remote, load_config())
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        assert job.repo == remote
        assert job.base_commit == _remote_ref(remote, "refs/heads/main")
        assert job.steps[0].exit_command == "python -m pytest -q"  # pyproject.toml found there
    assert _remote_ref(remote, f"refs/heads/merlin/{job_id}") == job.base_commit
    assert not list(settings.worktrees_dir.glob("files-*"))  # the checkout is gone
    db.dispose()


def test_a_task_that_cannot_reach_the_remote_leaves_the_job_to_recovery(
    tmp_path: Path, py_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.exceptions import Ignore

    from merlin_flow.engine.leases import claim
    from merlin_flow.store import Step
    from workers import tasks as worker_tasks

    settings = _machine(tmp_path, "m")
    db = open_database(settings.database)
    tasklist = TaskList.model_validate(
        {"title": "t", "steps": [{"id": "s1", "step_type": "Test", "description": "d"}]}
    )
    job_id = create_job(db, settings, tasklist, py_repo, load_config())
    with db.reader() as session:
        step_id = session.get_one(Job, job_id).steps[0].id
    monkeypatch.setattr(worker_tasks, "runtime", lambda: (db, settings))
    monkeypatch.setattr(worker_tasks, "PAUSES", (0.0, 0.0))

    def failing_with(error: Exception) -> object:
        def work(db_: object, settings_: object, token: str) -> None:
            assert claim(db, step_id, "attempt", token, 60)  # the task holds the step
            raise error

        return work

    with pytest.raises(RemoteUnavailable):  # the task fails; its lease will run out
        worker_tasks._guard(job_id, "s1", failing_with(RemoteUnavailable("remote down")))
    with db.reader() as session:
        assert session.get_one(Job, job_id).status == "pending"
        assert session.get_one(Step, step_id).status == "Pending"
    # Against a refusal, which goes on past every try: the job is parked, not failed.
    with db.session() as session:
        session.get_one(Step, step_id).lease_owner = None
    with pytest.raises(Ignore):
        worker_tasks._guard(job_id, "s1", failing_with(GitError("push refused")))
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        assert job.status == "parked"
        assert "push refused" in (job.error or "")
        assert "after 3 tries" in (job.error or "")
    db.dispose()


def test_a_job_ends_even_when_its_remote_is_gone_for_good(tmp_path: Path, remote: str) -> None:
    from merlin_flow.jobs.control import cancel_job
    from merlin_flow.jobs.views import job_view

    submitter, control = _machine(tmp_path, "submitter"), _machine(tmp_path, "control")
    db = open_database(f"sqlite:///{tmp_path / 'merlin.db'}")
    tasklist = TaskList.model_validate(
        {"title": "t", "steps": [{"id": "s1", "step_type": "Test", "description": "d"}]}
    )
    job_id = create_job(db, submitter, tasklist, remote, load_config())
    shutil.rmtree(remote.removeprefix("file://"))
    # The control machine has no cache and can never make one: the job still ends.
    assert cancel_job(db, control, job_id) == "cancelled"
    view = job_view(db, job_id)
    assert view["finished_at"] is not None
    patch = Path(view["patch"])
    assert patch.read_text() == ""
    assert "patch: not written" in patch.with_name("summary.md").read_text()
    db.dispose()


def _truncate_biggest_pack(cache: Path) -> None:
    """What a killed fetch, a full disk or a crash can leave of the cache's main pack."""
    pack = max((cache / "objects" / "pack").glob("*.pack"), key=lambda path: path.stat().st_size)
    pack.chmod(0o644)
    with pack.open("r+b") as handle:
        handle.truncate(pack.stat().st_size // 2)


def test_a_corrupt_cache_is_cloned_again_and_the_command_runs(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repository, "RETRY_DELAYS", (0.0,))
    settings = _machine(tmp_path, "one")
    one = repository_for_input(remote, settings)
    base = one.base_commit()
    one.start_branch("merlin/j1", base)
    commit = _commit_on(one, base, "notes.txt", "from machine one\n")
    one.publish(attempt_ref("j1", "s1", 1), commit)
    assert one.advance("merlin/j1", commit, base)
    live = add_worktree(one.path, one.scratch / "live", commit)  # a step's, mid-task

    # Git in the cache (a worktree for a step): cloned again, then the worktree is made.
    _truncate_biggest_pack(one.path)
    assert git_repair.damaged(one.path)
    add_worktree(one.path, one.scratch / "verify", commit)
    assert git(one.scratch / "verify", "show", "HEAD:notes.txt") == "from machine one"
    assert git(live, "rev-parse", "HEAD") == commit  # its entry moved to the new clone
    # A fetch in the cache (a job's base): the same.
    _truncate_biggest_pack(one.path)
    again = repository_of(remote, settings)
    assert again.base_commit() == base
    again.have("j1", commit)
    assert git_repair.damaged(one.path) == []
    left = {path.name for path in one.path.parent.iterdir()}
    assert left == {one.path.name, f"{one.path.name}.lock"}  # nothing corrupt kept aside


def test_a_cache_another_worker_cloned_again_is_not_cloned_twice(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = repository_for_input(remote, _machine(tmp_path, "one"))
    started = time.time()
    _truncate_biggest_pack(one.path)
    error = "error: packfile ./objects/pack/x.pack does not match index\nfatal: bad object HEAD"
    assert git_repair.recover(one.path, error, started)  # cloned again: try again
    monkeypatch.setattr(git_repair, "_reclone", lambda *args: pytest.fail("cloned twice"))
    assert git_repair.recover(one.path, error, started)  # another worker's clone will do
