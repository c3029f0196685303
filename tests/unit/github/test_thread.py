"""What merlin writes in a GitHub thread, from a real job's view and a planned TaskList."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.github.thread import (
    followed_job,
    plan_comment,
    progress_comment,
    pull_request_body,
)
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import TaskList
from tests.unit.engine.finished_jobs import finished_job

CONFIG = MerlinConfig(tiers=[Tier(name="local", model="openai/x", price_in=2.0)])
TASKLIST = TaskList.model_validate({"title": "Fix | the timeout", "steps": [
    {"id": "fix", "step_type": "Debug", "description": "raise the timeout",
     "exit_command": "pytest -q tests/test_auth.py"},
    {"id": "docs", "step_type": "Refactor", "description": "say why", "depends_on": ["fix"]},
]})  # fmt: skip
RECORD: dict[str, Any] = {
    "kind": "task", "fallback": False, "planned": True, "reason": "a plan", "problems": [],
    "complexity": "medium", "seconds": 1.2, "prompt_tokens": 800, "completion_tokens": 90,
    "cost_usd": 0.0021,
    "steps": [{"id": "fix", "title": "Raise the timeout", "estimated_tokens": 3000}],
}  # fmt: skip


def test_the_plan_comment_shows_the_table_the_exit_commands_and_what_to_reply() -> None:
    commands = {"fix": "pytest -q tests/test_auth.py", "docs": "ruff check ."}
    text = plan_comment(RECORD, CONFIG, TASKLIST, commands, "<!-- merlin-plan v1 x y -->", False)
    lines = text.splitlines()
    assert lines[0] == "### merlin's plan: Fix \\| the timeout"
    assert lines[2] == (
        "Planned by tier local in 1.2 s (800 tokens in, 90 out, $0.0021); a plan, medium."
    )
    assert "| `fix` | Debug | Raise the timeout | - | 3000 | $0.0060 (local) |" in lines
    assert "| `docs` | Refactor | say why | fix | unknown | unknown (local) |" in lines
    assert "| **total** | | | | ≥3000 | ≥$0.0060 |" in lines
    assert "- `fix`: `pytest -q tests/test_auth.py`" in lines
    assert "- `docs`: `ruff check .`" in lines
    assert "Reply `/merlin approve` to run it, or `/merlin reject` to drop it." in lines
    assert lines[-1] == "<!-- merlin-plan v1 x y -->"
    auto = plan_comment(RECORD, CONFIG, TASKLIST, {}, "", auto=True)
    assert "Running it now (label `merlin:auto`)." in auto


def test_a_fallback_plan_is_a_warning() -> None:
    fallback = dict(RECORD, fallback=True, problems=["the answer held no steps."])
    text = plan_comment(fallback, CONFIG, TASKLIST, {}, "", auto=False)
    assert "> [!WARNING]\n> FALLBACK: the planner's answer could not be used" in text


def test_progress_of_a_finished_job_and_its_failure(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    passed = finished_job(db, settings, py_repo, tmp_path, "true", price_in=1.0, price_out=2.0)
    text = progress_comment(job_view(db, passed), "https://github.example/run/1")
    lines = text.splitlines()
    assert lines[0] == f"### merlin job `{passed}`: completed (2 of 2 steps passed)"
    assert "[The workflow run](https://github.example/run/1) has the log." in lines
    rows = [line for line in lines if line.startswith("| `")]
    assert [row.split(" | ")[:4] for row in rows] == [
        ["| `fix`", "passed", "local", "1"],
        ["| `docs`", "passed", "local", "1"],
    ]
    assert followed_job(text) == passed
    (tmp_path / "b").mkdir()
    failed = finished_job(db, settings, py_repo, tmp_path / "b", "sh -c 'echo boom; exit 3'")
    text = progress_comment(job_view(db, failed), None)
    assert f"`{failed}`: failed (0 of 2 steps passed)" in text
    assert "**Step `fix` failed:**" in text
    assert "```text\nboom\n```" in text
    assert "| `docs` | skipped | local | 0 | $0.0000 |" in text
    assert followed_job("no mark here") is None


def test_the_pull_request_body_shows_each_steps_exit_command_result_tiers_and_cost(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "true", price_in=1.0, price_out=2.0)
    view = job_view(db, job)
    costs = [f"${step['attempts'][0]['known_cost_usd']:.4f}" for step in view["steps"]]
    assert costs[0] != "$0.0000"  # the calls were priced
    lines = pull_request_body(7, view).splitlines()
    assert lines[:3] == ["Closes #7.", "", f"Made by merlin job `{job}`: t, completed "
                         "(2 of 2 steps passed)."]  # fmt: skip
    assert lines[4:8] == [
        "| step | exit command | result | tiers | attempts | cost |",
        "|---|---|---|---|---|---|",
        f"| `fix` | `true` | passed (exit code 0) | local | 1 | {costs[0]} |",
        f"| `docs` | `true` | passed (exit code 0) | local | 1 | {costs[1]} |",
    ]
    assert lines[-1] == f"**Cost:** ${view['known_cost_usd']:.4f}."
    assert view["known_cost_usd"] > 0
    unpriced = {**view, "unpriced_calls": 2}
    assert pull_request_body(7, unpriced).splitlines()[-1] == (  # type: ignore[arg-type]
        f"**Cost:** ${view['known_cost_usd']:.4f} known, plus 2 model calls with no known price."
    )


def test_the_pull_request_body_of_a_failed_step_and_an_awkward_exit_command(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job = finished_job(db, settings, py_repo, tmp_path, "sh -c 'echo `boom` | cat; exit 3'")
    rows = [line for line in pull_request_body(7, job_view(db, job)).splitlines()
            if line.startswith("| `")]  # fmt: skip
    command = "`` sh -c 'echo `boom` \\| cat; exit 3' ``"
    assert rows == [
        f"| `fix` | {command} | failed (exit code 3) | local | 1 | $0.0000 |",
        f"| `docs` | {command} | skipped | local | 0 | $0.0000 |",
    ]
