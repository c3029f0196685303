"""`merlin run` and `merlin submit` through the CLI: `--quiet`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.cli.common import state
from merlin_flow.jobs.views import job_status
from merlin_flow.store import JobStatus
from tests.conftest import make_repo

MERLIN_TOML = '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n'
TASKLIST = """\
title: x
steps:
  - {id: fix, step_type: Debug, description: d, exit_command: "true"}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a scripted tier, and a TaskList beside it."""
    (tmp_path / "tasklist.yaml").write_text(TASKLIST)
    return make_repo(
        tmp_path / "repo",
        {"app.py": "X = 1\n", "merlin.toml": MERLIN_TOML, "local.yaml": "rules: []\n"},
    )


@pytest.mark.parametrize("flag", ["-q", "--quiet"])
def test_submit_quiet_prints_the_job_id_alone(
    merlin_home: Path, repo: Path, tmp_path: Path, flag: str
) -> None:
    result = CliRunner().invoke(
        app, ["submit", str(tmp_path / "tasklist.yaml"), "--repo", str(repo), flag]
    )
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"\w{8,}\n", result.stdout), result.stdout
    _, db = state()
    assert job_status(db, result.stdout.strip()) == JobStatus.PENDING
    assert "warning: no worker" in result.stderr  # warnings still go to stderr


@pytest.mark.parametrize("command", ["run", "submit"])
def test_quiet_and_json_are_refused_together(
    merlin_home: Path, repo: Path, tmp_path: Path, command: str
) -> None:
    args = [command, str(tmp_path / "tasklist.yaml"), "--repo", str(repo), "-q", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--quiet and --json" in result.stderr
    assert result.stdout == ""
    assert not (merlin_home / "merlin.db").exists()  # refused before anything was opened


def test_quiet_is_in_the_help_of_run_and_submit() -> None:
    for command in ("run", "submit"):
        text = CliRunner().invoke(app, [command, "-h"]).output
        assert re.search(r"^  -q, --quiet\s+Print only the result on stdout", text, re.M), text
