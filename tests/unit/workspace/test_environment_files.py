"""What the worker reads and writes of a built environment: never through a link setup left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from merlin_flow.errors import SetupFailed
from merlin_flow.workspace.environment_files import (
    MARKER_FILE,
    OVERLAY_DIR,
    OVERLAY_MAX_BYTES,
    check_built,
    copy_generated_files,
    inside,
    keep_generated_files,
    touch_marker,
    write_marker,
)
from tests.conftest import git, make_repo


@pytest.fixture
def env(tmp_path: Path) -> Path:
    folder = tmp_path / "env"
    (folder / "build").mkdir(parents=True)
    (folder / "node_modules" / "pkg").mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (folder / "bin").symlink_to("/usr/bin")  # inside the sandbox only: no concern
    return folder


def test_a_clean_build_passes_and_its_bound_folders_are_inside(env: Path) -> None:
    check_built(env)
    assert inside(env, "build") == env / "build"
    assert inside(env, "node_modules") == env / "node_modules"
    assert inside(env, "missing") is None
    assert inside(env, "bin") is None


@pytest.mark.parametrize("name", ["build", "node_modules", "pyvenv.cfg"])
def test_a_bound_name_made_a_link_is_refused(env: Path, tmp_path: Path, name: str) -> None:
    path = env / name
    if path.is_dir():
        os.rename(path, tmp_path / "was")
    else:
        path.unlink()
    path.symlink_to(tmp_path)
    assert inside(env, name) is None
    with pytest.raises(
        SetupFailed, match=rf"`\$MERLIN_ENV/{name}` as a symbolic link to {tmp_path}"
    ):
        check_built(env)


def test_a_link_inside_the_environment_is_refused_too(env: Path) -> None:
    """The sandbox binds by host path: even a link that stays inside is not followed."""
    (env / "build").rmdir()
    (env / "real-build").mkdir()
    (env / "build").symlink_to("real-build")
    with pytest.raises(SetupFailed, match="build"):
        check_built(env)


@pytest.mark.parametrize("name", [MARKER_FILE, OVERLAY_DIR])
def test_merlins_own_names_written_by_setup_are_refused(env: Path, name: str) -> None:
    (env / name).symlink_to("/etc/passwd")
    with pytest.raises(SetupFailed, match="a name merlin keeps for its own files"):
        check_built(env)


def test_a_build_cache_that_is_a_file_is_refused(env: Path) -> None:
    (env / "build").rmdir()
    (env / "build").write_text("")
    with pytest.raises(SetupFailed, match="as a file"):
        check_built(env)


def test_generated_files_are_kept_bounded_and_never_through_a_link(
    tmp_path: Path, env: Path
) -> None:
    ignore = "*.gen\nbig.bin\n__pycache__/\n*.pyc\nout.gen\nlinked.gen\n"
    repo = make_repo(tmp_path / "repo", {".gitignore": ignore, "src/pkg/__init__.py": ""})
    checkout = tmp_path / "checkout"
    git(repo, "worktree", "add", "-q", "--detach", str(checkout), "HEAD")
    (checkout / "src" / "pkg" / "_version.gen").write_text("1.0\n")
    (checkout / "src" / "pkg" / "tool.gen").write_text("#!/bin/sh\n")
    (checkout / "src" / "pkg" / "tool.gen").chmod(0o755)
    (checkout / "src" / "pkg" / "mod.pyc").write_bytes(b"\0")
    (checkout / "big.bin").write_bytes(b"x" * (OVERLAY_MAX_BYTES + 1))
    secret = tmp_path / "secret"
    secret.write_text("host only\n")
    (checkout / "linked.gen").symlink_to(secret)
    kept = keep_generated_files(checkout, env)
    assert sorted(kept) == ["src/pkg/_version.gen", "src/pkg/tool.gen"]
    overlay = env / OVERLAY_DIR
    assert (overlay / "src" / "pkg" / "_version.gen").read_text() == "1.0\n"
    assert os.access(overlay / "src" / "pkg" / "tool.gen", os.X_OK)
    assert not (overlay / "linked.gen").exists()
    assert not (overlay / "big.bin").exists()


@pytest.fixture
def overlay(env: Path) -> Path:
    folder = env / OVERLAY_DIR
    (folder / "src" / "pkg").mkdir(parents=True)
    (folder / "src" / "pkg" / "_version.py").write_text("VERSION = '1.0'\n")
    (folder / "app.py").write_text("generated\n")
    (folder / "out" / "post-commit").parent.mkdir()
    (folder / "out" / "post-commit").write_text("#!/bin/sh\n")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    return folder


def test_generated_files_go_into_a_worktree_never_over_its_own(
    env: Path, overlay: Path, tmp_path: Path
) -> None:
    worktree = tmp_path / "wt"
    worktree.mkdir()
    (worktree / "app.py").write_text("the commit's\n")
    (worktree / ".git").write_text("gitdir: /elsewhere\n")
    copy_generated_files(env, worktree)
    assert (worktree / "src" / "pkg" / "_version.py").read_text() == "VERSION = '1.0'\n"
    assert (worktree / "app.py").read_text() == "the commit's\n"
    assert (worktree / ".git").read_text() == "gitdir: /elsewhere\n"


def test_a_link_of_the_commit_that_leads_out_gets_nothing(
    env: Path, overlay: Path, tmp_path: Path
) -> None:
    hooks = tmp_path / "user" / ".git" / "hooks"
    hooks.mkdir(parents=True)
    worktree = tmp_path / "wt"
    worktree.mkdir()
    (worktree / "out").symlink_to(hooks)
    (worktree / "src").symlink_to(tmp_path / "user")  # a folder that leads out
    copy_generated_files(env, worktree)
    assert list(hooks.iterdir()) == []
    assert not (tmp_path / "user" / "pkg").exists()


def test_a_link_in_the_overlay_is_never_read(env: Path, overlay: Path, tmp_path: Path) -> None:
    """The worker makes the overlay; one with links (an older worker's) still leaks nothing."""
    secret = tmp_path / "secret"
    secret.write_text("host only\n")
    (overlay / "leak.txt").symlink_to(secret)
    (overlay / "folder").symlink_to(tmp_path)
    worktree = tmp_path / "wt"
    worktree.mkdir()
    copy_generated_files(env, worktree)
    assert not (worktree / "leak.txt").exists()
    assert not (worktree / "folder").exists()
    other = tmp_path / "other-env"
    other.mkdir()
    (other / OVERLAY_DIR).symlink_to(overlay)  # a linked overlay is not followed
    into = tmp_path / "wt2"
    into.mkdir()
    copy_generated_files(other, into)
    assert list(into.iterdir()) == []


def test_the_marker_is_made_new_and_touched_through_no_link(env: Path, tmp_path: Path) -> None:
    write_marker(env, {"key": "k"})
    assert (env / MARKER_FILE).read_text() == '{\n  "key": "k"\n}\n'
    with pytest.raises(FileExistsError):
        write_marker(env, {"key": "again"})
    victim = tmp_path / "victim"
    victim.write_text("x")
    os.utime(victim, (0, 0))
    other = tmp_path / "other"
    other.mkdir()
    (other / MARKER_FILE).symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_marker(other, {"key": "k"})
    touch_marker(other)
    assert victim.stat().st_mtime == 0
    assert victim.read_text() == "x"
