"""A finished job on a scripted model, for the tests of what a job leaves (summary, reports)."""

from __future__ import annotations

from pathlib import Path

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist

SCRIPT = """\
rules:
  - match: 'Step fix \\('
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - match: 'Step docs \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: NOTES.md, content: "why and how\\n"}
  - reply: {content: done}
"""


def finished_job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, exit_command: str, **tier: float
) -> str:
    """Two Debug steps with ``exit_command``, worked to the end on one scripted tier."""
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}", **tier)],
        limits=Limits(fix_attempts=0),
        exit_commands={"Debug": exit_command},
    )
    steps = [
        {"id": "fix", "step_type": "Debug", "description": "answer 42"},
        {"id": "docs", "step_type": "Debug", "description": "say <why> & how"},
    ]
    job_id = create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)
    for key in ("fix", "docs"):
        execute_step(db, settings, job_id, key, f"{key}:a")
        verify_step(db, settings, job_id, key, f"{key}:b")
    finalize_job(db, settings, job_id)
    return job_id
