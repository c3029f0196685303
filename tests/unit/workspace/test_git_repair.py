"""The debris a killed git leaves (half-made worktree entries, locks, temporary packs, a
locked worktree) is repaired or passed, and the command that stumbled on it runs: no job
ends on it. A corrupt cache of a git URL is cloned again; a user's repository never is."""

from __future__ import annotations

import os
import shutil
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
    uncommitted_files,
)
from merlin_flow.workspace.git import git as merlin_git
from merlin_flow.workspace.git_repair import damaged, is_debris_error, merlin_cache, recover, repair
from merlin_flow.workspace.repository import repository_for_input, repository_of
from merlin_flow.workspace.worktree_cleanup import clear_job
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

    def repair_later(cwd: Path, error: str) -> list[str]:
        tries.append(cwd)
        if len(tries) == 3:
            lock.unlink()  # the live command ends and drops its lock
        return real_repair(cwd, error)

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


def test_an_index_lock_goes_only_when_the_failed_command_named_it(
    py_repo: Path, tmp_path: Path
) -> None:
    """A user's `git commit` holds index.lock while its editor is open, for minutes."""
    head = git(py_repo, "rev-parse", "HEAD")
    users = add_worktree(py_repo, tmp_path / "users-own", head)
    admin = Path(git(users, "rev-parse", "--absolute-git-dir"))
    index_locks = [py_repo / ".git" / "index.lock", admin / "index.lock"]
    ref_lock = py_repo / ".git" / "refs" / "heads" / "j1.lock"
    for lock in (*index_locks, ref_lock):
        lock.write_text("")
    aged(*index_locks, ref_lock)
    create_branch(py_repo, "j1", head)  # fails on the ref lock, which is repaired
    assert not ref_lock.exists()
    assert all(lock.exists() for lock in index_locks)
    # Merlin needs neither: its worktrees have their own index, and it never takes the
    # user's (no optional locks when it diffs the work tree).
    (py_repo / "app.py").write_text("changed\n")
    assert uncommitted_files(py_repo) == ["app.py"]
    attempt = add_worktree(py_repo, tmp_path / "attempt", head)
    (attempt / "notes.txt").write_text("work\n")
    assert commit_all(attempt, "attempt", tmp_path / "excludes")


def test_a_killed_shallow_fetch_leaves_a_shallow_lock_the_next_fetch_removes(
    py_repo: Path, tmp_path: Path
) -> None:
    clone = tmp_path / "shallow.git"
    git(tmp_path, "clone", "-q", "--bare", "--depth", "1", f"file://{py_repo}", str(clone))
    (py_repo / "more.txt").write_text("more\n")
    git(py_repo, "add", "-A")
    git(py_repo, "commit", "-q", "-m", "more")
    lock = clone / "shallow.lock"
    lock.write_text("")
    aged(lock)
    merlin_git("fetch", "-q", "--depth", "1", f"file://{py_repo}", "+main:main", cwd=clone)
    assert git(clone, "rev-parse", "main") == git(py_repo, "rev-parse", "HEAD")
    assert not lock.exists()


def locked_and_gone(repo: Path, path: Path, head: str) -> Path:
    """A worktree locked, its admin folder holding a killed commit's index.lock, its folder
    gone: the entry it leaves."""
    worktree = add_worktree(repo, path, head)
    admin = Path(git(worktree, "rev-parse", "--absolute-git-dir"))
    git(repo, "worktree", "lock", "--reason", "initializing", str(worktree))
    (admin / "index.lock").write_text("")
    aged(admin / "index.lock", admin)
    shutil.rmtree(worktree)
    return admin


def test_a_locked_worktree_whose_folder_is_gone_blocks_no_worktree(
    py_repo: Path, tmp_path: Path
) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    path = tmp_path / "worktrees" / "j1" / "s1-1-abcd"
    locked_and_gone(py_repo, path, head)
    plain = run_git(["worktree", "add", "--detach", "--force", str(path), head], py_repo)
    assert "missing but locked" in plain.stderr  # the debris is real
    assert (add_worktree(py_repo, path, head) / "app.py").is_file()  # at its path
    locked_and_gone(py_repo, path, head)
    assert (add_worktree(py_repo, tmp_path / "other", head) / "app.py").is_file()  # elsewhere


def test_merlin_cleanup_removes_a_locked_worktree_left_by_a_killed_worker(
    py_repo: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    head = git(py_repo, "rev-parse", "HEAD")
    gone = settings.worktrees_dir / "j1" / "s1-1-abcd"
    admin = locked_and_gone(py_repo, gone, head)
    half = add_worktree(py_repo, settings.worktrees_dir / "j1" / "s2-1-efgh", head)
    git(py_repo, "worktree", "lock", "--reason", "initializing", str(half))
    (half / "app.py").unlink()  # killed while it checked the files out
    clear_job(settings, "j1", py_repo)
    assert not admin.exists()
    assert not (settings.worktrees_dir / "j1").exists()
    assert "j1" not in git(py_repo, "worktree", "list", "--porcelain")


def test_a_worktree_killed_while_it_was_made_is_made_again_at_its_path(
    py_repo: Path, tmp_path: Path
) -> None:
    head = git(py_repo, "rev-parse", "HEAD")
    path = tmp_path / "s1-1-abcd"
    add_worktree(py_repo, path, head)
    git(py_repo, "worktree", "lock", "--reason", "initializing", str(path))
    (path / ".git").unlink()  # killed before it wrote the folder's .git
    (path / "app.py").unlink()
    assert git(add_worktree(py_repo, path, head), "rev-parse", "HEAD") == head
    assert (path / "app.py").is_file()


def packed(repo: Path) -> Path:
    """Pack ``repo``'s objects; its pack file."""
    git(repo, "repack", "-a", "-d", "-q")
    (pack,) = (Path(git(repo, "rev-parse", "--absolute-git-dir")) / "objects" / "pack").glob(
        "*.pack"
    )
    return pack


def truncated(pack: Path) -> Path:
    """What a killed fetch, a full disk or a crash can leave of a pack."""
    pack.chmod(0o644)
    os.truncate(pack, pack.stat().st_size // 2)
    return pack


def test_a_truncated_pack_and_an_empty_loose_object_are_found(py_repo: Path) -> None:
    git_dir = py_repo / ".git"
    assert damaged(git_dir) == []
    pack = truncated(packed(py_repo))
    assert damaged(git_dir) == [f"objects/pack/{pack.name}"]
    loose = git_dir / "objects" / "ab" / ("c" * 38)
    loose.parent.mkdir()
    loose.write_bytes(b"")
    error = f"error: object file {loose} is empty\nfatal: bad object HEAD"
    assert damaged(git_dir, error) == [f"objects/ab/{loose.name}", f"objects/pack/{pack.name}"]


def test_a_corrupt_user_repository_is_never_cloned_again(py_repo: Path, tmp_path: Path) -> None:
    # Nor a bare clone in a `repos` folder: only one named after its own URL is a cache.
    bare = tmp_path / "repos" / "repo.git"
    git(tmp_path, "clone", "-q", "--bare", f"file://{py_repo}", str(bare))
    for repo in (py_repo, bare):
        pack = truncated(packed(repo))
        failed = run_git(["rev-parse", "HEAD^{tree}"], repo)
        assert "does not match index" in failed.stderr
        assert merlin_cache(repo) is None
        assert not recover(repo, failed.stderr, 0.0)
        assert pack.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["repo", "repos"]
    assert [path.name for path in bare.parent.iterdir()] == ["repo.git"]


@pytest.mark.parametrize(
    ("message", "hint"),
    [
        ("error: packfile ./objects/pack/pack-1a.pack does not match index", True),
        ("error: file:///r.git did not send all necessary objects\nfatal: bad object 5f7c", True),
        ("error: inflate: data stream error (incorrect header check)", True),
        ("remote: fatal: bad object 5f7c\nfatal: the remote end hung up", False),
        ("fatal: invalid reference: main", False),
    ],
)
def test_only_failures_that_may_come_of_corruption_look_for_it(message: str, hint: bool) -> None:
    local = "\n".join(line for line in message.splitlines() if not line.startswith("remote:"))
    assert (git_repair.CORRUPTION_HINT.search(local) is not None) is hint
