"""`merlin plan`'s preview table and what it suggests after `--out`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.cli.planning import plan_table, submit_command
from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.tasklist import TaskList
from tests.conftest import make_repo

PLAN = (
    '{"steps": [{"id": "point", "step_type": "Feature", "title": "Add Point", "instruction": '
    '"Add a Point class to geo.py", "estimated_tokens": 20000}]}'
)
REQUEST = "Add a Point class with distance() to geo.py and test it well"


def _rows(estimates: list[int | None], price: float | None = 2.0) -> list[str]:
    """The preview's rows (steps a, b, ... with these token estimates, then the total)."""
    ids = [chr(ord("a") + n) for n in range(len(estimates))]
    record: dict[str, Any] = {
        "kind": "task", "fallback": False, "planned": False, "reason": "a test",
        "steps": [
            {"id": i, "title": f"step {i}", "estimated_tokens": e}
            for i, e in zip(ids, estimates, strict=True)
        ],
    }  # fmt: skip
    tasklist = TaskList.model_validate(
        {"title": "t", "steps": [{"id": i, "step_type": "Feature", "description": i} for i in ids]}
    )
    config = MerlinConfig(tiers=[Tier(name="local", model="openai/x", price_in=price)])
    console = Console(record=True, width=200, color_system=None)
    console.print(plan_table(record, config, tasklist))
    return [
        " ".join(filter(None, (cell.strip() for cell in line.split("│")[1:-1])))
        for line in console.export_text().splitlines()
        if line.startswith("│ ")
    ]


def test_a_step_without_an_estimate_says_unknown_and_the_total_is_a_floor() -> None:
    assert _rows([1000, None]) == [
        "a Feature step a - 1000 $0.0020 (local)",
        "b Feature step b - unknown unknown (local)",
        "total ≥1000 ≥$0.0020",
    ]


def test_a_total_with_no_known_estimate_is_unknown_not_zero() -> None:
    assert _rows([None, None])[-1] == "total unknown unknown"
    assert _rows([300, 700])[-1] == "total 1000 $0.0020"  # all known: the plain sum
    # estimated tokens, but no price for the tier: the tokens add up, the cost is unknown
    assert _rows([300, 700], price=None)[-1] == "total 1000 unknown"


def test_the_suggested_submit_carries_the_repo_and_config_of_the_plan() -> None:
    assert submit_command(Path("plan.yaml"), ".", None) == "merlin submit plan.yaml"
    assert submit_command(Path("my plan.yaml"), "../app", Path("ci/merlin.toml")) == (
        "merlin submit 'my plan.yaml' --repo ../app --config ci/merlin.toml"
    )


@pytest.fixture
def planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A repository without a merlin.toml, and a config file beside it with the planner."""
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    script = tmp_path / "planner.yaml"
    script.write_text(yaml.safe_dump({"rules": [{"match": "geo.py", "reply": {"content": PLAN}}]}))
    config = tmp_path / "merlin.toml"
    config.write_text(f'[[tiers]]\nname = "local"\nmodel = "scripted/{script}"\n')
    return make_repo(tmp_path / "repo", {"geo.py": "X = 1\n"}), config


def test_plan_out_suggests_submitting_with_the_same_repo_and_config(
    planner: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, config = planner
    out = tmp_path / "plan.yaml"
    args = ["plan", REQUEST, "--out", str(out), "--config", str(config)]
    result = CliRunner().invoke(app, [*args, "--repo", str(repo)])
    assert result.exit_code == 0, result.output
    suggested = f"`merlin submit {out} --repo {repo} --config {config}`"
    assert suggested in " ".join(result.stdout.split())
    monkeypatch.chdir(repo)  # --repo left at its default: not repeated
    here = CliRunner().invoke(app, args)
    assert here.exit_code == 0, here.output
    assert f"`merlin submit {out} --config {config}`" in " ".join(here.stdout.split())


def test_plan_says_where_steps_start_and_plans_even_without_a_readable_journal(
    planner: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, config = planner
    args = ["plan", REQUEST, "--config", str(config), "--repo", str(repo)]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "starts on:" in result.stdout
    assert ": local: by the rules (0 similar steps in the journal, 3 needed to learn)" in (
        result.stdout
    )
    # A database merlin cannot read (no schema: a server not migrated) leaves the rules.
    monkeypatch.setenv("MERLIN_DATABASE_URL", "postgresql+psycopg://127.0.0.1:1/none")
    unreadable = CliRunner().invoke(app, args, terminal_width=200)
    assert unreadable.exit_code == 0, unreadable.output
    assert "the journal could not be read" in unreadable.stderr
    assert "starts on:" not in unreadable.stdout
    assert "plan:" in unreadable.stdout
