"""Git plumbing: repositories, branches, attempt worktrees, commits and refs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from merlin_flow.errors import GitError, RepositoryError
from merlin_flow.workspace.git import (
    IGNORED_IN_COMMITS,
    add_worktree,
    advance_branch,
    attempt_ref,
    changed_files,
    commit_all,
    commit_tree,
    commits_between,
    create_branch,
    diff,
    find_repository,
    head_commit,
    job_branch,
    patch_bytes,
    remove_worktree,
    resolve_ref,
    set_ref,
    write_excludes_file,
)
from tests.conftest import git


def user_checkout_state(repo: Path) -> dict[str, object]:
    """What the user sees: files, index status, current branch, HEAD and branch list."""
    files = {
        p.relative_to(repo).as_posix(): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }
    return {
        "files": files,
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "branch": git(repo, "rev-parse", "--abbrev-ref", "HEAD"),
        "head": git(repo, "rev-parse", "HEAD"),
        "staged": git(repo, "diff", "--cached", "--name-status"),
        "branches": git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads"),
    }


@pytest.fixture
def dirty_repo(py_repo: Path) -> Path:
    """The user's checkout with unstaged, staged and untracked changes."""
    (py_repo / "app.py").write_text("def answer():\n    return 0  # user's unstaged edit\n")
    (py_repo / "staged.txt").write_text("staged by the user\n")
    git(py_repo, "add", "staged.txt")
    (py_repo / "untracked.txt").write_text("untracked\n")
    return py_repo


# --- find_repository -----------------------------------------------------------------------


def test_find_repository_rejects_a_plain_folder(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    with pytest.raises(RepositoryError, match="not a git work tree") as info:
        find_repository(folder)
    assert str(folder.resolve()) in str(info.value)


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder another user's needs root")
def test_find_repository_says_when_git_refuses_another_users_repository(py_repo: Path) -> None:
    """A volume mounted with the wrong owner: git's own reason, not "not a git work tree"."""
    for path in [py_repo, *py_repo.rglob("*")]:
        os.lchown(path, 65534, 65534)
    with pytest.raises(RepositoryError, match="belongs to another user") as info:
        find_repository(py_repo)
    assert f"safe.directory {py_repo.resolve()}" in str(info.value)


def test_find_repository_rejects_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="does not exist or is not a folder"):
        find_repository(tmp_path / "missing")


def test_find_repository_rejects_a_file(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(RepositoryError, match="not a folder"):
        find_repository(tmp_path / "f.txt")


def test_find_repository_rejects_a_repository_without_commits(tmp_path: Path) -> None:
    repo = tmp_path / "empty"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    with pytest.raises(RepositoryError, match="has no commits yet: commit something first"):
        find_repository(repo)


def test_find_repository_rejects_the_git_folder_itself(py_repo: Path) -> None:
    with pytest.raises(RepositoryError):
        find_repository(py_repo / ".git")


def test_find_repository_from_a_subfolder_returns_the_top(py_repo: Path) -> None:
    sub = py_repo / "pkg" / "inner"
    sub.mkdir(parents=True)
    assert find_repository(sub).resolve() == py_repo.resolve()
    assert find_repository(py_repo).resolve() == py_repo.resolve()


def test_find_repository_returns_a_path_that_works_from_anywhere(
    py_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(py_repo.parent)
    top = find_repository(Path(py_repo.name) / ".")
    assert top.is_absolute()
    assert (top / "app.py").is_file()


# --- branches and refs ---------------------------------------------------------------------


def test_create_branch_at_head_leaves_the_checkout_alone(dirty_repo: Path) -> None:
    before = user_checkout_state(dirty_repo)
    head = head_commit(dirty_repo)
    branch = job_branch("job1")
    assert branch == "merlin/job1"

    create_branch(dirty_repo, branch, head)

    assert resolve_ref(dirty_repo, f"refs/heads/{branch}") == head
    after = user_checkout_state(dirty_repo)
    assert after["branch"] == "main"
    assert {k: v for k, v in after.items() if k != "branches"} == {
        k: v for k, v in before.items() if k != "branches"
    }


def test_create_branch_refuses_an_existing_branch(py_repo: Path) -> None:
    head = head_commit(py_repo)
    create_branch(py_repo, "merlin/job1", head)
    with pytest.raises(GitError):
        create_branch(py_repo, "merlin/job1", head)
    with pytest.raises(GitError):
        create_branch(py_repo, "main", head)


def second_commit(repo: Path, tmp_path: Path, name: str = "wt") -> str:
    """A commit on top of HEAD, made in a throwaway worktree."""
    worktree = add_worktree(repo, tmp_path / "worktrees" / name, head_commit(repo))
    (worktree / f"{name}.py").write_text("print('hi')\n")
    commit = commit_all(worktree, f"add {name}", write_excludes_file(tmp_path / "excludes"))
    remove_worktree(repo, worktree)
    return commit


def test_advance_branch_is_a_compare_and_swap(py_repo: Path, tmp_path: Path) -> None:
    start = head_commit(py_repo)
    branch = "merlin/job1"
    create_branch(py_repo, branch, start)
    first = second_commit(py_repo, tmp_path, "one")
    other = second_commit(py_repo, tmp_path, "two")

    assert advance_branch(py_repo, branch, first, start)
    assert resolve_ref(py_repo, f"refs/heads/{branch}") == first

    # A second writer that still believes the branch is at `start` loses.
    assert not advance_branch(py_repo, branch, other, start)
    assert resolve_ref(py_repo, f"refs/heads/{branch}") == first

    assert advance_branch(py_repo, branch, other, first)
    assert resolve_ref(py_repo, f"refs/heads/{branch}") == other
    assert git(py_repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert head_commit(py_repo) == start


def test_advance_branch_to_where_it_already_is(py_repo: Path) -> None:
    start = head_commit(py_repo)
    create_branch(py_repo, "merlin/job1", start)
    assert advance_branch(py_repo, "merlin/job1", start, start)
    assert resolve_ref(py_repo, "refs/heads/merlin/job1") == start


def test_advance_branch_no_op_still_checks_the_branch(py_repo: Path, tmp_path: Path) -> None:
    start = head_commit(py_repo)
    moved = second_commit(py_repo, tmp_path)
    create_branch(py_repo, "merlin/job1", moved)
    # The branch is at `moved`, not at `start`: the expected old value is wrong.
    assert not advance_branch(py_repo, "merlin/job1", start, start)


def test_advance_branch_of_a_missing_branch_fails(py_repo: Path, tmp_path: Path) -> None:
    start = head_commit(py_repo)
    new = second_commit(py_repo, tmp_path)
    assert not advance_branch(py_repo, "merlin/nobody", new, start)
    assert resolve_ref(py_repo, "refs/heads/merlin/nobody") is None


def test_attempt_refs_live_under_refs_merlin(py_repo: Path, tmp_path: Path) -> None:
    ref = attempt_ref("job1", "step-a", 2)
    assert ref == "refs/merlin/job1/step-a/2"
    commit = second_commit(py_repo, tmp_path)

    set_ref(py_repo, ref, commit)

    assert resolve_ref(py_repo, ref) == commit
    assert git(py_repo, "for-each-ref", "--format=%(refname)", "refs/merlin") == ref
    # Not a branch or a tag: the user's `git branch` stays clean.
    assert git(py_repo, "branch", "--list", "--format=%(refname)") == "refs/heads/main"
    assert git(py_repo, "tag", "--list") == ""
    # The ref keeps the commit alive after its worktree is gone.
    git(py_repo, "gc", "--prune=now", "--quiet")
    assert git(py_repo, "cat-file", "-t", commit) == "commit"


def test_resolve_ref_of_a_missing_ref_is_none(py_repo: Path) -> None:
    assert resolve_ref(py_repo, "refs/merlin/none/x/1") is None
    assert resolve_ref(py_repo, "refs/heads/main") == head_commit(py_repo)


# --- worktrees and commits -----------------------------------------------------------------


def test_attempt_lifecycle_leaves_the_user_checkout_unchanged(
    dirty_repo: Path, tmp_path: Path
) -> None:
    before = user_checkout_state(dirty_repo)
    start = head_commit(dirty_repo)
    path = tmp_path / "home" / "worktrees" / "job1-a-1"

    worktree = add_worktree(dirty_repo, path, start)
    assert worktree == path
    # A clean, detached checkout of the commit: none of the user's uncommitted changes.
    assert (worktree / "app.py").read_text() == "def answer():\n    return 41\n"
    assert not (worktree / "staged.txt").exists()
    assert not (worktree / "untracked.txt").exists()
    assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"

    (worktree / "app.py").write_text("def answer():\n    return 42\n")
    (worktree / "new_module.py").write_text("X = 1\n")
    (worktree / "test_app.py").unlink()
    commit = commit_all(worktree, "step a", write_excludes_file(tmp_path / "home" / "ex"))
    set_ref(dirty_repo, attempt_ref("job1", "a", 1), commit)
    remove_worktree(dirty_repo, worktree)

    assert user_checkout_state(dirty_repo) == before
    assert not path.exists()
    assert str(path) not in git(dirty_repo, "worktree", "list", "--porcelain")
    assert git(dirty_repo, "rev-parse", f"{commit}^") == start
    assert changed_files(dirty_repo, start, commit) == ["app.py", "new_module.py", "test_app.py"]
    assert git(dirty_repo, "log", "-1", "--format=%an <%ae>|%s", commit) == (
        "merlin <merlin@localhost>|step a"
    )


def test_commit_all_leaves_out_caches(py_repo: Path, tmp_path: Path) -> None:
    excludes = write_excludes_file(tmp_path / "home" / "commit-excludes")
    worktree = add_worktree(py_repo, tmp_path / "wt", head_commit(py_repo))
    (worktree / "__pycache__").mkdir()
    (worktree / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\x00pyc")
    (worktree / "pkg" / "__pycache__").mkdir(parents=True)
    (worktree / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\x00pyc")
    (worktree / "pkg" / "m.py").write_text("M = 1\n")
    (worktree / "stray.pyo").write_bytes(b"\x00")
    for cache in (".pytest_cache", ".mypy_cache", ".ruff_cache"):
        (worktree / cache / "v").mkdir(parents=True)
        (worktree / cache / "v" / "data").write_text("{}")

    commit = commit_all(worktree, "with caches", excludes)

    tracked = git(py_repo, "ls-tree", "-r", "--name-only", commit).splitlines()
    assert sorted(tracked) == ["app.py", "pkg/m.py", "pyproject.toml", "test_app.py"]
    remove_worktree(py_repo, worktree)


def test_commit_all_with_no_change_makes_an_empty_commit(py_repo: Path, tmp_path: Path) -> None:
    start = head_commit(py_repo)
    worktree = add_worktree(py_repo, tmp_path / "wt", start)
    commit = commit_all(worktree, "nothing", write_excludes_file(tmp_path / "ex"))
    assert commit != start
    assert git(py_repo, "rev-parse", f"{commit}^") == start
    assert changed_files(py_repo, start, commit) == []
    # (Distinct commits with equal trees give a lone "\n"; only the same commit gives "".)
    assert diff(py_repo, start, commit).strip() == ""
    assert diff(py_repo, start, start) == ""
    remove_worktree(py_repo, worktree)


def test_a_commit_given_its_parent_has_that_parent_wherever_head_went(
    py_repo: Path, tmp_path: Path
) -> None:
    start = head_commit(py_repo)
    worktree = add_worktree(py_repo, tmp_path / "wt", start)
    (worktree / "new.py").write_text("x = 1\n")
    git(worktree, "add", "new.py")
    git(worktree, "commit", "-qm", "a commit made inside the worktree")  # HEAD moved
    moved = git(worktree, "rev-parse", "HEAD")
    (worktree / "more.py").write_text("y = 2\n")
    git(worktree, "add", "-A")
    commit = commit_tree(worktree, git(worktree, "write-tree"), start, "step a\n\nJob j.")
    assert git(py_repo, "rev-parse", f"{commit}^@") == start  # one parent: the start
    assert git(worktree, "rev-parse", "HEAD") == moved  # HEAD stays
    assert sorted(changed_files(py_repo, start, commit)) == ["more.py", "new.py"]
    assert git(py_repo, "log", "-1", "--format=%B", commit) == "step a\n\nJob j."
    remove_worktree(py_repo, worktree)


def test_hooks_of_the_user_repository_do_not_run(py_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "hook-ran"
    hooks = py_repo / ".git" / "hooks"
    for hook in ("post-checkout", "pre-commit", "commit-msg", "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\nexit 1\n")
        (hooks / hook).chmod(0o755)

    worktree = add_worktree(py_repo, tmp_path / "wt", head_commit(py_repo))
    (worktree / "x.py").write_text("x = 1\n")
    commit = commit_all(worktree, "hooks off", write_excludes_file(tmp_path / "ex"))

    assert not marker.exists()
    assert "x.py" in git(py_repo, "ls-tree", "--name-only", commit)
    remove_worktree(py_repo, worktree)


def test_add_worktree_replaces_a_stale_one(py_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "wt"
    first = add_worktree(py_repo, path, head_commit(py_repo))
    (first / "leftover.txt").write_text("from a crashed attempt\n")
    (first / "app.py").write_text("broken\n")

    again = add_worktree(py_repo, path, head_commit(py_repo))

    assert not (again / "leftover.txt").exists()
    assert (again / "app.py").read_text() == "def answer():\n    return 41\n"
    listed = git(py_repo, "worktree", "list", "--porcelain").count(f"worktree {path}")
    assert listed == 1
    remove_worktree(py_repo, path)


def test_add_worktree_after_its_folder_was_deleted(py_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "wt"
    add_worktree(py_repo, path, head_commit(py_repo))
    subprocess.run(["rm", "-rf", str(path)], check=True)
    again = add_worktree(py_repo, path, head_commit(py_repo))
    assert (again / "app.py").is_file()
    remove_worktree(py_repo, path)


def test_remove_worktree_of_a_missing_path_is_harmless(py_repo: Path, tmp_path: Path) -> None:
    remove_worktree(py_repo, tmp_path / "never-created")
    assert git(py_repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_write_excludes_file(tmp_path: Path) -> None:
    path = write_excludes_file(tmp_path / "a" / "b" / "excludes")
    assert path.read_text().splitlines() == list(IGNORED_IN_COMMITS)
    for pattern in ("__pycache__/", ".pytest_cache/", "*.py[co]"):
        assert pattern in IGNORED_IN_COMMITS
    # An existing file (possibly edited by the operator) is kept.
    path.write_text("custom/\n")
    assert write_excludes_file(path).read_text() == "custom/\n"


def test_diff_and_commits_between(py_repo: Path, tmp_path: Path) -> None:
    start = head_commit(py_repo)
    worktree = add_worktree(py_repo, tmp_path / "wt", start)
    excludes = write_excludes_file(tmp_path / "ex")
    (worktree / "one.py").write_text("ONE = 1\n")
    first = commit_all(worktree, "one", excludes)
    (worktree / "two.py").write_text("TWO = 2\n")
    second = commit_all(worktree, "two", excludes)
    remove_worktree(py_repo, worktree)

    assert commits_between(py_repo, start, second) == [first, second]
    assert commits_between(py_repo, second, second) == []
    patch = diff(py_repo, start, second)
    assert "+ONE = 1" in patch
    assert "+TWO = 2" in patch
    assert patch.endswith("\n")
    assert changed_files(py_repo, first, second) == ["two.py"]


def test_a_worktree_left_locked_by_a_killed_git_is_removed(py_repo: Path, tmp_path: Path) -> None:
    # A worker killed inside `git worktree add` leaves the worktree locked "initializing",
    # often with its folder gone: a single --force and `git worktree prune` both keep it.
    path = tmp_path / "worktrees" / "job" / "s1-1"
    git(py_repo, "worktree", "add", "-q", "--detach", str(path))
    git(py_repo, "worktree", "lock", "--reason", "initializing", str(path))
    shutil.rmtree(path)
    remove_worktree(py_repo, path)
    assert str(path) not in git(py_repo, "worktree", "list")


def test_a_patch_with_a_binary_file_and_another_encoding_applies(
    py_repo: Path, tmp_path: Path
) -> None:
    """The job's patch file is git's exact bytes: `git apply` takes a binary file and latin-1."""
    start = head_commit(py_repo)
    worktree = add_worktree(py_repo, tmp_path / "wt", start)
    (worktree / "logo.png").write_bytes(bytes(range(256)) * 4)
    (worktree / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    commit = commit_all(worktree, "binary", write_excludes_file(tmp_path / "ex"))
    patch = tmp_path / "job.patch"
    patch.write_bytes(patch_bytes(py_repo, start, commit))
    assert "Binary files" in diff(py_repo, start, commit)  # shown to people as such
    assert "caf\ufffd" in diff(py_repo, start, commit)
    target = add_worktree(py_repo, tmp_path / "target", start)
    git(target, "apply", "--index", str(patch))
    assert (target / "logo.png").read_bytes() == bytes(range(256)) * 4
    assert (target / "latin1.txt").read_bytes() == "café\n".encode("latin-1")
    remove_worktree(py_repo, worktree)
    remove_worktree(py_repo, target)
