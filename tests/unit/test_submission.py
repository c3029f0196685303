"""submit_job, the library's one way in: every check holds for a library caller too."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from merlin_flow.errors import ConfigError, InputError
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus
from merlin_flow.submission import submit_job
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git, make_repo

TASKLIST = {"title": "t", "steps": [{"id": "fix", "step_type": "Debug", "description": "42"}]}


def _jobs(db: Database) -> int:
    with db.reader() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def _job_files(folder: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A merlin.toml (one scripted tier, its script in ``tmp_path``) and a TaskList file."""
    script = tmp_path / "local.yaml"
    script.write_text("rules: []\n")
    config = folder / "merlin.toml"
    config.write_text(f'[[tiers]]\nname = "local"\nmodel = "scripted/{script}"\n')
    tasklist = folder / "tasklist.yaml"
    tasklist.write_text("title: t\nsteps:\n  - {id: fix, step_type: Debug, description: d}\n")
    return config, tasklist


def _repo_with_scripted_config(tmp_path: Path) -> Path:
    """A repository whose merlin.toml names a script inside it, and its bare clone."""
    repo = make_repo(
        tmp_path / "repo",
        {
            "app.py": "def answer():\n    return 41\n",
            "local.yaml": "rules: []\n",
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n',
        },
    )
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    return bare


def test_a_git_url_whose_config_names_scripts_inside_it_is_refused(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    bare = _repo_with_scripted_config(tmp_path)
    with pytest.raises(ConfigError, match="give --config"):
        submit_job(db, settings, parse_tasklist(TASKLIST), f"file://{bare}")
    assert _jobs(db) == 0
    assert git(bare, "branch", "--list", "merlin/*") == ""


def test_a_budget_of_nothing_is_refused_before_anything_is_read(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    with pytest.raises(InputError, match="--budget must be more than 0 USD"):
        submit_job(db, settings, parse_tasklist(TASKLIST), str(py_repo), budget_usd=0.0)
    assert _jobs(db) == 0
    assert git(py_repo, "branch", "--list", "merlin/*") == ""


def test_a_tasklist_file_and_a_repository_make_a_pending_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, tasklist = _job_files(tmp_path, tmp_path)

    submission = submit_job(db, settings, tasklist, str(py_repo), config, budget_usd=1.0)

    assert submission.config.tiers[0].name == "local"
    with db.reader() as session:
        job = session.get_one(Job, submission.job_id)
        assert (job.status, job.budget_usd, len(job.steps)) == (JobStatus.PENDING, 1.0, 1)
        assert job.steps[0].exit_command == "python -m pytest -q"  # found the project kind
    assert git(py_repo, "branch", "--list", f"merlin/{submission.job_id}").strip()


def test_uncommitted_changes_are_named_as_left_out(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, _ = _job_files(tmp_path, tmp_path)
    tasklist = parse_tasklist(TASKLIST)
    clean = submit_job(db, settings, tasklist, str(py_repo), config)
    assert clean.warnings == ()
    (py_repo / "app.py").write_text("def answer():\n    return 42\n")
    (py_repo / "notes.txt").write_text("new\n")
    dirty = submit_job(db, settings, tasklist, str(py_repo), config)
    head = git(py_repo, "rev-parse", "HEAD")[:10]
    (warning,) = dirty.warnings
    assert "uncommitted changes (app.py, notes.txt)" in warning
    assert f"starts from HEAD {head} without them" in warning


def test_the_tasklist_and_config_files_themselves_are_not_warned_about(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, tasklist = _job_files(py_repo, tmp_path)
    assert submit_job(db, settings, tasklist, str(py_repo), config).warnings == ()
