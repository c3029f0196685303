"""A commit's root listing and object ids: read by git once per commit id, per process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from merlin_flow.errors import GitError
from merlin_flow.workspace import commit_trees
from merlin_flow.workspace.commit_trees import object_ids, root_entries
from tests.conftest import git, make_repo


@pytest.fixture(autouse=True)
def _nothing_kept() -> Iterator[None]:
    commit_trees.forget()
    yield
    commit_trees.forget()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The git commands the module runs."""
    seen: list[list[str]] = []
    real = commit_trees.run_git

    def counting(args: list[str], cwd: Path, *rest: object, **kwargs: object) -> object:
        seen.append(args)
        return real(args, cwd)

    monkeypatch.setattr(commit_trees, "run_git", counting)
    return seen


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {"pyproject.toml": "[project]\n", "src/pkg/__init__.py": "", "a b ü.txt": "odd\n"}
    return make_repo(tmp_path / "repo", files)


def test_root_entries_are_what_git_names_and_a_commit_id_is_read_once(
    repo: Path, calls: list[list[str]]
) -> None:
    head = git(repo, "rev-parse", "HEAD")
    first = root_entries(repo, head)
    assert set(first) == {"pyproject.toml", "src", "a b ü.txt"}
    for name, object_id in first.items():
        assert object_id == git(repo, "rev-parse", f"HEAD:{name}")
    first["src"] = "changed by the caller"
    assert root_entries(repo, head)["src"] == git(repo, "rev-parse", "HEAD:src")
    assert len(calls) == 1


def test_a_name_that_can_move_is_read_every_time(repo: Path, calls: list[list[str]]) -> None:
    before = root_entries(repo, "HEAD")
    (repo / "new.txt").write_text("new\n")
    git(repo, "add", "new.txt")
    git(repo, "commit", "-qm", "new")
    assert set(root_entries(repo, "HEAD")) == {*before, "new.txt"}
    assert len(calls) == 2


def test_a_commit_that_is_not_there_is_a_git_error(repo: Path) -> None:
    with pytest.raises(GitError, match="ls-tree"):
        root_entries(repo, "0" * 40)


def test_object_ids_look_deeper_only_under_a_folder_that_exists(
    repo: Path, calls: list[list[str]]
) -> None:
    head = git(repo, "rev-parse", "HEAD")
    wanted = ["pyproject.toml", ".cargo/config.toml", "missing.txt", "src/pkg/__init__.py"]
    found = object_ids(repo, head, wanted)
    assert list(found) == sorted(wanted)
    assert found["pyproject.toml"] == git(repo, "rev-parse", "HEAD:pyproject.toml")
    assert found["src/pkg/__init__.py"] == git(repo, "rev-parse", "HEAD:src/pkg/__init__.py")
    assert found["missing.txt"] is None
    assert found[".cargo/config.toml"] is None
    assert len(calls) == 2  # the root, then the one path under a folder that is there
    assert calls[1][1] == "ls-tree"
    assert calls[1][-2:] == ["--", "src/pkg/__init__.py"]
    object_ids(repo, head, ["pyproject.toml", ".cargo/config.toml"])
    assert len(calls) == 2  # the root was kept; .cargo is not there


def test_only_the_newest_commits_are_kept(
    repo: Path, calls: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commit_trees, "KEPT", 2)
    commits = [git(repo, "rev-parse", "HEAD")]
    for n in range(2):
        (repo / f"f{n}").write_text("x")
        git(repo, "add", ".")
        git(repo, "commit", "-qm", f"c{n}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    for commit in commits:
        root_entries(repo, commit)
    root_entries(repo, commits[2])
    assert len(calls) == 3
    root_entries(repo, commits[0])  # the oldest was dropped: read again
    assert len(calls) == 4


def test_a_child_forked_while_the_lock_was_held_reads_all_the_same(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    root_entries(repo, head)
    with commit_trees._lock:  # a thread of the parent is inside, as a prefork pool forks
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's result is its exit status
            os._exit(0 if "src" in root_entries(repo, head) else 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    raise AssertionError("the child waited for a lock no thread of its own held")
