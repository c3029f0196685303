"""A job on a repository where a killed worker left git debris completes.

A worker SIGKILLed inside ``git worktree add`` leaves a half-made entry in the
repository's ``worktrees/`` folder; inside ``git fetch`` or ``git update-ref``, lock
files and a temporary pack. Every later ``worktree add`` of that repository used to fail
("failed to read worktrees/.../commondir"), and the job with it ("internal error:
GitError"). Now the debris is removed (``merlin_flow.workspace.git_repair``) and the job
runs to the end.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import merlin, merlin_env, write_job_files

pytestmark = pytest.mark.e2e


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
    long_ago = time.time() - 600
    for path in debris:
        os.utime(path, (long_ago, long_ago))

    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["status"] == "completed"
    assert not any(path.exists() for path in debris)
