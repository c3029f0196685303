"""The debris a killed git leaves (half-made worktree entries, locks, temporary packs) is
repaired, and the command that stumbled on it runs: no job ends on it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from merlin_flow.settings import Settings
from merlin_flow.workspace import git_repair
from merlin_flow.workspace.git import (
    add_worktree,
    attempt_ref,
    commit_all,
    create_branch,
    remove_worktree,
    run_git,
)
from merlin_flow.workspace.git_repair import is_debris_error, repair
from merlin_flow.workspace.repository import repository_for_input, repository_of
from tests.conftest import git


def aged(*paths: Path, seconds: float = 600) -> None:
    """Make ``paths`` look ``seconds`` old, as debris of a worker killed that long ago."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def half_made_entry(repo: Path, name: str = "s28-1-verify") -> Path:
    """What `git worktree add` killed while it wrote its entry leaves: its gitdir, and an
    empty commondir (the debris seen in a kill campaign)."""
    entry = repo / ".git" / "worktrees" / name
    entry.mkdir(parents=True)
    (entry / "gitdir").write_text(f"{repo.parent / name / '.git'}\n")
    (entry / "commondir").write_text("")
    aged(entry / "gitdir", entry / "commondir", entry)
    return entry


def test_a_half_made_worktree_entry_no_longer_fails_every_worktree_add(
    py_repo: Path, tmp_path: Path
) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    entry = half_made_entry(py_repo)
    failed = run_git(["worktree", "add", "--detach", str(tmp_path / "raw"), head], py_repo)
    assert failed.returncode != 0  # the debris is real: plain git stumbles on it
    assert is_debris_error(failed.stderr), failed.stderr

    worktree = add_worktree(py_repo, tmp_path / "s25-1-verify", head)
    assert (worktree / "app.py").is_file()
    assert not entry.exists()
    remove_worktree(py_repo, worktree)


def test_a_whole_worktree_and_young_debris_are_left_alone(py_repo: Path, tmp_path: Path) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    live = add_worktree(py_repo, tmp_path / "live", head)
    entries = py_repo / ".git" / "worktrees"
    aged(*entries.iterdir())
    young = entries / "being-added"
    young.mkdir()
    (young / "commondir").write_text("")  # a `worktree add` running right now
    assert repair(py_repo) == []
    assert (live / ".git").is_file()
    assert git(live, "rev-parse", "HEAD") == head


def test_an_entry_locked_initializing_whose_worktree_never_came_is_removed(
    py_repo: Path, tmp_path: Path
) -> None:
    entry = py_repo / ".git" / "worktrees" / "killed"
    entry.mkdir(parents=True)
    for name, text in (("gitdir", f"{tmp_path / 'never' / '.git'}\n"), ("HEAD", "abc\n")):
        (entry / name).write_text(text)
    (entry / "commondir").write_text("../..\n")
    (entry / "locked").write_text("initializing")
    aged(entry)
    assert repair(py_repo) == ["worktrees/killed"]


def test_a_stale_ref_lock_no_longer_refuses_the_branch(py_repo: Path) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    lock = py_repo / ".git" / "refs" / "heads" / "merlin" / "job1.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    aged(lock)
    create_branch(py_repo, "merlin/job1", head)
    assert git(py_repo, "rev-parse", "merlin/job1") == head
    assert not lock.exists()


def test_a_killed_commit_leaves_an_index_lock_the_next_commit_removes(
    py_repo: Path, tmp_path: Path
) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    worktree = add_worktree(py_repo, tmp_path / "attempt", head)
    admin = Path(git(worktree, "rev-parse", "--absolute-git-dir"))
    (admin / "index.lock").write_text("")
    aged(admin / "index.lock")
    (worktree / "notes.txt").write_text("the attempt's work\n")
    commit = commit_all(worktree, "attempt", tmp_path / "excludes")
    assert git(py_repo, "show", f"{commit}:notes.txt") == "the attempt's work"


def test_a_live_lock_is_waited_for_not_removed(
    py_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock younger than a git command takes is another command's: git is tried again."""
    head = git(py_repo, "rev-parse", "HEAD")
    lock = py_repo / ".git" / "refs" / "heads" / "busy.lock"
    lock.write_text("")
    monkeypatch.setattr("merlin_flow.workspace.git.REPAIR_PAUSE", 0.2)
    tries = []
    real_repair = git_repair.repair

    def repair_later(cwd: Path) -> list[str]:
        tries.append(cwd)
        if len(tries) == 3:
            lock.unlink()  # the live command ends and drops its lock
        return real_repair(cwd)

    monkeypatch.setattr("merlin_flow.workspace.git.repair", repair_later)
    create_branch(py_repo, "busy", head)
    assert len(tries) == 3
    assert git(py_repo, "rev-parse", "busy") == head


def test_a_killed_fetch_leaves_ref_locks_and_a_temporary_pack(
    py_repo: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(bare))
    url = f"file://{bare}"
    source = repository_for_input(url, Settings(home=tmp_path / "one"))
    base = source.base_commit()
    source.start_branch("merlin/j1", base)
    # Machine two's cache, as a worker killed inside `git fetch` left it.
    two = repository_of(url, Settings(home=tmp_path / "two"))
    cache = Path(git(two.path, "rev-parse", "--absolute-git-dir"))
    lock = cache / "refs" / "merlin" / "j1" / "s1" / "1.lock"
    lock.parent.mkdir(parents=True)
    debris = [lock, cache / "shallow.lock", cache / "objects" / "pack" / "tmp_pack_Xq12"]
    for path in debris:
        path.write_bytes(b"PACK\x00\x00")  # the pack a killed fetch had begun
    aged(*debris)
    worktree = tmp_path / "make"
    add_worktree(source.path, worktree, base)
    (worktree / "notes.txt").write_text("from machine one\n")
    commit = commit_all(worktree, "add notes", tmp_path / "excludes")
    source.publish(attempt_ref("j1", "s1", 1), commit)
    two.have("j1", commit)
    assert git(two.path, "show", f"{commit}:notes.txt") == "from machine one"
    assert not any(path.exists() for path in debris)


@pytest.mark.parametrize(
    ("message", "debris"),
    [
        ("fatal: Unable to create '/r/.git/refs/heads/x.lock': File exists.", True),
        ("fatal: failed to read worktrees/s28-1-verify/commondir: Success", True),
        ("fatal: '/home/u/.merlin/worktrees/j1/s1-1' is not a working tree", False),
        ("fatal: invalid reference: main", False),
    ],
)
def test_only_debris_errors_are_repaired(message: str, debris: bool) -> None:
    assert is_debris_error(message) is debris
