"""An attempt's commit, driven through the step task: nested repositories and secrets kept out."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Attempt, Database, Event
from merlin_flow.store.events import EventKind
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.workspace.staging import NESTED_REMOVED
from tests.conftest import git, require_bwrap
from tests.unit.scripted_jobs import ONE_STEP
from tests.unit.workspace.test_staging import objects_holding

NESTED = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: run_command
          arguments:
            command: >-
              mkdir -p vendor/lib && echo 'x = 1' > vendor/lib/x.py &&
              git init -q vendor/lib && git -C vendor/lib config core.fsmonitor 'touch {marker}'
              && git -C vendor/lib -c user.name=m -c user.email=m@m commit -q --allow-empty -m x
        - name: edit_file
          arguments: {{path: app.py, old: "return 41", new: "return 42"}}
  - reply: {{content: done}}
"""


def _job(db: Database, settings: Settings, repo: Path, tmp_path: Path, script: str) -> str:
    (tmp_path / "script.yaml").write_text(script)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{tmp_path / 'script.yaml'}")],
        limits=Limits(fix_attempts=0),
        exit_commands={"Debug": "true"},
    )
    return create_job(db, settings, parse_tasklist(ONE_STEP), repo, config)


def test_a_repository_the_attempt_made_is_removed_and_its_files_committed(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    require_bwrap()
    marker = tmp_path / "fsmonitor-ran"
    job_id = _job(db, settings, py_repo, tmp_path, NESTED.format(marker=marker))
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    with db.reader() as session:
        attempt = session.scalars(select(Attempt)).one()
        events = session.scalars(
            select(Event).where(Event.kind == EventKind.NESTED_REPOSITORY_REMOVED)
        ).all()
        assert attempt.error is None
        assert [(e.message, e.data) for e in events] == [
            (f"vendor/lib: {NESTED_REMOVED}", {"attempt": 1})
        ]
        commit = attempt.commit or ""
    listing = git(py_repo, "ls-tree", "-r", commit)
    assert "100644 blob" in listing
    assert "vendor/lib/x.py" in listing
    assert "160000" not in listing  # no gitlink reaches the branch
    assert not marker.exists()


def test_a_refused_attempt_leaves_no_blob_in_the_users_repository(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """The secret's blob is in no object store: not the repository's, not a quarantine's."""
    secret = "AKIAIOSFODNN7EXAMPLE"
    script = f"""\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {{path: keys.py, content: "AWS = '{secret}'\\n"}}
  - reply: {{content: done}}
"""
    job_id = _job(db, settings, py_repo, tmp_path, script)
    execute_step(db, settings, job_id, "s0", "w:1")
    with db.reader() as session:
        assert "AWS Access Key" in (session.scalars(select(Attempt)).one().error or "")
    assert objects_holding(py_repo, secret) == []
    assert not list(settings.worktrees_dir.rglob("*quarantine*"))
