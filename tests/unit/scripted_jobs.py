"""A scripted model on a real git repository and SQLite: jobs the engine tests drive."""

from __future__ import annotations

from pathlib import Path

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist

SCRIPT = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - reply: {content: done}
"""

# The cheap tier breaks the answer, then breaks it again when asked to repair it.
LOCAL_WRONG = """\
rules:
  - match: 'repair them'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 40", new: "return 43"}
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 40"}
  - reply: {content: "done"}
"""


ONE_STEP = {"title": "t", "steps": [{"id": "s0", "step_type": "Debug", "description": "42"}]}


def priced_tier(tmp_path: Path, price_out: float) -> Tier:
    """A tier "local" answering with SCRIPT at $1 per M input tokens and ``price_out``."""
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    return Tier(name="local", model=f"scripted/{script}", price_in=1.0, price_out=price_out)


def scripted_job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, steps: int = 1
) -> str:
    """A job of ``steps`` Debug steps on tier "local", which answers with SCRIPT."""
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
    tasklist = parse_tasklist(
        {
            "title": "t",
            "steps": [
                {"id": f"s{i}", "step_type": "Debug", "description": "answer 42"}
                for i in range(steps)
            ],
        }
    )
    return create_job(db, settings, tasklist, repo, config)


def rate_limited_then_premium(tmp_path: Path, limits: Limits) -> MerlinConfig:
    """A local tier that always answers RateLimitError, and a premium tier that works."""
    local = tmp_path / "local.yaml"
    local.write_text("rules:\n  - reply: {error: RateLimitError}\n")
    premium = tmp_path / "premium.yaml"
    premium.write_text(SCRIPT)
    return MerlinConfig(
        tiers=[
            Tier(name="local", model=f"scripted/{local}"),
            Tier(name="premium", model=f"scripted/{premium}", price_in=3.0, price_out=15.0),
        ],
        limits=limits,
    )
