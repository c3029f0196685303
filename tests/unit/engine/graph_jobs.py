"""Graph jobs the engine tests drive: steps with dependencies, a scripted model writing files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Dispatch, Outcome
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Step
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import make_repo


def write(path: str, content: str, match: str) -> dict[str, Any]:
    return {
        "match": match,
        "turn": 0,
        "reply": {
            "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]
        },
    }


def job(
    db: Database,
    settings: Settings,
    tmp_path: Path,
    steps: list[dict[str, Any]],
    rules: list[dict[str, Any]],
    **tasklist: Any,
) -> tuple[str, Path]:
    import yaml

    repo = make_repo(tmp_path / "repo", {"shared.txt": "x\n", "README": "r\n"})
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"rules": [*rules, {"reply": {"content": "done"}}]}))
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")], limits=Limits(fix_attempts=1)
    )
    listed = parse_tasklist({"title": "graph", "steps": steps, **tasklist})
    return create_job(db, settings, listed, repo, config), repo


def step(key: str, command: str, *needs: str, **more: Any) -> dict[str, Any]:
    return {
        "id": key,
        "step_type": "Feature",
        "description": f"do {key}",
        "exit_command": command,
        "depends_on": list(needs),
        **more,
    }


def run(db: Database, settings: Settings, job_id: str, key: str) -> tuple[Outcome, Dispatch]:
    assert execute_step(db, settings, job_id, key, f"{key}:a") is Outcome.CONTINUE
    return verify_step(db, settings, job_id, key, f"{key}:v")


def step_rows(db: Database, job_id: str) -> dict[str, Step]:
    with db.reader() as session:
        steps = session.scalars(select(Step).where(Step.job_id == job_id)).all()
        for step in steps:
            list(step.attempts)
        return {step.key: step for step in steps}


DIAMOND = [
    step("a", "grep -q A a.txt"),
    step("b", "grep -q B b.txt", "a"),
    step("c", "grep -q C c.txt", "a"),
    step("d", "sh -c 'grep -q B b.txt && grep -q C c.txt && grep -q D d.txt'", "b", "c"),
]

DIAMOND_RULES = [
    write("a.txt", "A\n", r"Step a \("),
    write("b.txt", "B\n", r"Step b \("),
    write("c.txt", "C\n", r"Step c \("),
    write("d.txt", "D\n", r"Step d \("),
]
