"""A job on a repository where a killed worker left git debris completes.

A worker SIGKILLed inside ``git worktree add`` leaves a half-made entry in the
repository's ``worktrees/`` folder, perhaps still locked "initializing"; inside ``git
fetch`` or ``git update-ref``, lock files (``shallow.lock`` too) and a temporary pack;
inside ``git commit`` in a worktree, that worktree's ``index.lock``. Every later
``worktree add`` of that repository used to fail ("failed to read
worktrees/.../commondir"), and the job with it ("internal error: GitError"). Now the
debris is removed or passed (``merlin_flow.workspace.git_repair``) and the job runs to
the end. A cache of a git URL whose pack a killed fetch, a full disk or a crash truncated
is cloned again; the user's own ``index.lock`` (their ``git commit``, its editor open) is
left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from merlin_flow.workspace.git_repair import RECLONED
from tests.conftest import git
from tests.e2e.helpers import merlin, merlin_env, write_job_files

pytestmark = pytest.mark.e2e

ONE_STEP = """\
title: Fix
steps:
  - id: fix
    step_type: Debug
    description: answer() must return 42
"""


def aged(*paths: Path) -> None:
    """Make ``paths`` look ten minutes old, as debris of a worker killed that long ago."""
    long_ago = time.time() - 600
    for path in paths:
        os.utime(path, (long_ago, long_ago))


def run_job(tmp_path: Path, repo: str, name: str) -> dict[str, object]:
    """`merlin run` one job of one step on ``repo``; its view, once completed."""
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / name, tasklist=ONE_STEP)
    result = merlin(env, "run", str(tasklist), "--repo", repo, "--config", str(config), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    view: dict[str, object] = json.loads(result.stdout)
    assert view["status"] == "completed", view
    return view


def test_a_job_completes_over_the_debris_of_killed_git_commands(
    tmp_path: Path, py_repo: Path
) -> None:
    git_dir = py_repo / ".git"
    entry = git_dir / "worktrees" / "s28-1-verify-dead"
    entry.mkdir(parents=True)
    (entry / "gitdir").write_text(f"{tmp_path / 'gone' / '.git'}\n")
    (entry / "commondir").write_text("")  # killed while it wrote this
    debris = [entry, git_dir / "packed-refs.lock", git_dir / "objects" / "pack" / "tmp_pack_a1"]
    for path in debris[1:]:
        path.write_bytes(b"")
    aged(*debris)

    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["status"] == "completed"
    assert not any(path.exists() for path in debris)


def test_a_job_completes_over_locks_and_a_locked_worktree(tmp_path: Path, py_repo: Path) -> None:
    git_dir = py_repo / ".git"
    head = git(py_repo, "rev-parse", "HEAD")
    # `git commit` killed in a worktree, then the worktree locked and its folder gone.
    worktree = tmp_path / "killed-attempt"
    git(py_repo, "worktree", "add", "-q", "--detach", str(worktree), head)
    git(py_repo, "worktree", "lock", "--reason", "initializing", str(worktree))
    shutil.rmtree(worktree)
    admin = git_dir / "worktrees" / "killed-attempt"
    # `worktree add` killed while it wrote its entry: locked "initializing", half-made.
    entry = git_dir / "worktrees" / "s3-1-dead"
    entry.mkdir(parents=True)
    (entry / "locked").write_text("initializing")
    (entry / "gitdir").write_text(f"{tmp_path / 'never' / '.git'}\n")
    (entry / "commondir").write_text("")
    # `git fetch --depth` killed; and the user's own `git commit`, its editor open.
    debris = [entry, admin / "index.lock", git_dir / "shallow.lock", git_dir / "index.lock"]
    for path in debris[1:]:
        path.write_bytes(b"")
    aged(*debris, *entry.iterdir(), admin)

    run_job(tmp_path, str(py_repo), "job")
    assert not entry.exists()
    assert not admin.exists()  # its `worktree add` never finished: no `.git` in its folder
    assert not (git_dir / "shallow.lock").exists()
    assert (git_dir / "index.lock").exists()  # the user's: merlin needs it not, nor takes it


def test_a_cache_with_a_truncated_pack_is_cloned_again(tmp_path: Path, py_repo: Path) -> None:
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(py_repo), str(bare))
    url = f"file://{bare}"
    run_job(tmp_path, url, "first")
    (cache,) = (tmp_path / "home" / "repos").glob("remote-*.git")
    pack = max((cache / "objects" / "pack").glob("*.pack"), key=lambda path: path.stat().st_size)
    pack.chmod(0o644)
    os.truncate(pack, pack.stat().st_size // 2)  # a killed fetch, a full disk, a crash

    view = run_job(tmp_path, url, "second")
    assert (cache / RECLONED).is_file()
    assert not list(cache.parent.glob("*.corrupt-*"))
    assert git(bare, "show", f"{view['branch']}:app.py").endswith("return 42")
