"""The files the map reads, named by git blob id: a worktree as it is, or a commit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from merlin_flow.workspace.repo_files import SourceFile, blob_id, list_sources, read_blobs
from tests.conftest import git, make_repo

FILES = {
    "app/core.py": "class Engine:\n    pass\n",
    "app/cli.py": "from app.core import Engine\n",
    "app/tests/test_core.py": "def test_engine():\n    pass\n",
    "web/index.ts": "export const x = 1\n",
    "node_modules/lib/index.js": "module.exports = 1\n",
    ".github/script.py": "print(1)\n",
    "README.md": "# app\n",
    "data.bin": "\0\0",
}


def everything(path: str) -> bool:
    return True


def test_a_clean_worktree_is_listed_from_git_with_its_blob_ids(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", FILES)
    files, read = list_sources(repo, None, everything)
    assert [(f.path, f.kind) for f in files] == [
        ("app/cli.py", "python"),
        ("app/core.py", "python"),
        ("app/tests/test_core.py", "python:refs"),
        ("web/index.ts", "typescript"),
    ]
    assert read == {}  # nothing read to list a clean worktree
    for file in files:
        assert file.blob == git(repo, "hash-object", file.path)
        assert file.blob == blob_id((repo / file.path).read_bytes())


def test_changed_new_and_deleted_files_are_listed_as_they_are_on_disk(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", FILES)
    (repo / "app/core.py").write_text("class Engine:\n    speed = 2\n")
    (repo / "app/new.py").write_text("def added():\n    pass\n")
    (repo / "web/index.ts").unlink()
    (repo / "ignored.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("ignored.py\n")
    os.symlink("core.py", repo / "app/link.py")
    files, read = list_sources(repo, None, everything)
    paths = {f.path: f.blob for f in files}
    assert sorted(paths) == ["app/cli.py", "app/core.py", "app/new.py", "app/tests/test_core.py"]
    assert paths["app/core.py"] == git(repo, "hash-object", "app/core.py")
    assert paths["app/new.py"] == git(repo, "hash-object", "app/new.py")
    assert read[paths["app/core.py"]] == b"class Engine:\n    speed = 2\n"


def test_include_hides_what_the_permissions_refuse(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", FILES)
    files, _read = list_sources(repo, None, lambda path: not path.startswith("app/"))
    assert [f.path for f in files] == ["web/index.ts"]


def test_a_commit_is_read_from_the_object_store_of_a_bare_repository(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", FILES)
    head = git(repo, "rev-parse", "HEAD")
    (repo / "app/core.py").write_text("changed on disk, not committed\n")
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    files, read = list_sources(bare, head, everything)
    assert read == {}
    core = next(f for f in files if f.path == "app/core.py")
    assert read_blobs(bare, head, [core]) == {core.blob: b"class Engine:\n    pass\n"}
    worktree_files, _ = list_sources(make_repo(tmp_path / "same", FILES), None, everything)
    assert files == worktree_files


def test_a_huge_file_is_not_read(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"big.py": "x = 1\n" * 300_000})
    head = git(repo, "rev-parse", "HEAD")
    (big,) = list_sources(repo, head, everything)[0]
    assert read_blobs(repo, head, [big]) == {big.blob: b"\0huge"}
    assert read_blobs(repo, None, [big]) == {big.blob: b"\0huge"}
    gone = SourceFile("gone.py", "0" * 40, "python")
    assert read_blobs(repo, None, [gone]) == {"0" * 40: b"\0unreadable"}


def test_a_renamed_file_is_listed_by_its_new_name_either_way(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", FILES)
    git(repo, "mv", "app/core.py", "app/engine.py")
    (repo / "app/cli.py").write_text("from app.engine import Engine\n")
    for refresh in (True, False):
        files, read = list_sources(repo, None, everything, refresh=refresh)
        paths = [f.path for f in files]
        assert "app/engine.py" in paths
        assert "app/core.py" not in paths
        assert sorted(read.values()) == [
            b"class Engine:\n    pass\n",
            b"from app.engine import Engine\n",
        ]


def test_a_folder_swapped_for_a_symlink_after_the_listing_shows_nothing_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process in the sandbox swaps a folder between git's listing and the read: no leak."""
    from merlin_flow.workspace import repo_files

    repo = make_repo(tmp_path / "repo", {"app.py": "x = 1\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mod.py").write_text("SECRET = 'outside the worktree'\n")
    (repo / "d").symlink_to(outside)  # swapped in once git listed d/mod.py as a new file
    monkeypatch.setattr(repo_files, "_changed", lambda root, refresh: ["d/mod.py"])
    files, read = list_sources(repo, None, lambda path: True)
    assert [f.path for f in files] == ["app.py"]
    assert not any(b"outside the worktree" in data for data in read.values())
    swapped = SourceFile("d/mod.py", "0" * 40, "python")
    assert read_blobs(repo, None, [swapped]) == {"0" * 40: b"\0unreadable"}
