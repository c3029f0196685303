"""Pushing a job's branch with a token that no error can carry, and the job's reports."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from merlin_flow.errors import GitError
from merlin_flow.github.running import push, summary_of, with_token
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.conftest import git
from tests.unit.engine.finished_jobs import finished_job

TOKEN = "ghs_secret_token_value"


def test_a_branch_is_pushed_under_its_new_name(py_repo: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(remote)], check=True)
    git(py_repo, "remote", "add", "origin", str(remote))
    git(py_repo, "branch", "merlin/abc")
    push(py_repo, TOKEN, "merlin/abc", "merlin/7-abc")
    assert git(remote, "rev-parse", "merlin/7-abc") == git(py_repo, "rev-parse", "merlin/abc")
    assert TOKEN not in git(py_repo, "config", "--list")  # nothing of it stays behind


def test_the_token_never_reaches_an_error_message(py_repo: Path) -> None:
    git(py_repo, "remote", "add", "origin", "http://127.0.0.1:9/nowhere.git")
    with pytest.raises(GitError) as failed:
        with_token(py_repo, TOKEN, "fetch", "origin")
    assert "fetch origin" in str(failed.value)
    assert TOKEN not in str(failed.value)
    assert "Z2hzX3NlY3JldF90b2tlbl92YWx1ZQ" not in str(failed.value)  # nor its base64


def test_the_summary_is_the_jobs_own(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    view = job_view(db, finished_job(db, settings, py_repo, tmp_path, "true"))
    assert summary_of(view) == Path(view["patch"] or "").with_name("summary.md").read_text()
    assert summary_of({**view, "patch": None}) == (  # type: ignore[typeddict-item]
        f"# t\n\nJob {view['id']} ended completed.\n"
    )
