"""Planning a request with a scripted planner on a real repository, and `merlin plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.config import MerlinConfig, Planning, Tier
from merlin_flow.planning.context import RepositoryContext
from merlin_flow.planning.planner import make_plan
from merlin_flow.planning.requests import Classification
from merlin_flow.tasklist import load_tasklist
from tests.conftest import make_repo

GOOD = (
    '{"steps": [{"id": "point", "step_type": "Feature", "title": "Add Point", "instruction": '
    '"Add a Point class to geo.py", "estimated_tokens": 20000, "files": ["geo.py"]}, '
    '{"id": "tests", "step_type": "Test", "title": "Test Point", "instruction": "Add tests", '
    '"depends_on": ["point"], "estimated_tokens": 10000}]}'
)
CYCLE = GOOD.replace('"files": ["geo.py"]}', '"files": ["geo.py"], "depends_on": ["tests"]}')
REQUEST = "Add a Point class with distance() to geo.py and test it well"


def planner_config(tmp_path: Path, *replies: str, price: float | None = 2.0) -> MerlinConfig:
    """A scripted planner that gives ``replies`` in turn (the repair request is turn 1)."""
    rules = [{"turn": n, "reply": {"content": reply}} for n, reply in enumerate(replies)]
    script = tmp_path / "planner.yaml"
    script.write_text(yaml.safe_dump({"rules": rules}))
    return MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}", price_in=price, price_out=price)],
        planning=Planning(max_steps=5),
    )


def no_context(_: Classification) -> RepositoryContext:
    return RepositoryContext(tree=("geo.py",), tree_total=1)


def test_a_request_is_planned_by_the_planning_tier(tmp_path: Path) -> None:
    plan = make_plan(REQUEST, planner_config(tmp_path, GOOD), no_context)
    assert (plan.planned, plan.fallback, plan.problems) == (True, False, [])
    assert [s.id for s in plan.steps] == ["point", "tests"]
    assert plan.answers == [GOOD]
    assert plan.prompt_tokens > 0
    assert plan.cost_usd is not None
    assert plan.cost_usd > 0


def test_a_bad_plan_is_sent_back_once_with_its_problems(tmp_path: Path) -> None:
    plan = make_plan(REQUEST, planner_config(tmp_path, CYCLE, GOOD), no_context)
    assert (plan.planned, plan.fallback) == (True, False)
    assert "The steps point -> tests -> point depend on each other in a cycle." in plan.problems
    assert len(plan.answers) == 2


def test_two_bad_answers_give_the_flagged_fallback(tmp_path: Path) -> None:
    plan = make_plan(REQUEST, planner_config(tmp_path, CYCLE, "no idea"), no_context)
    assert (plan.planned, plan.fallback) == (False, True)
    assert [s.id for s in plan.steps] == ["request"]
    assert plan.steps[0].instruction == REQUEST
    assert plan.problems[-1].startswith("the planner's answer holds no plan")


def test_a_failing_planner_model_gives_the_fallback_not_a_crash(tmp_path: Path) -> None:
    config = planner_config(tmp_path)  # no rule fits: the scripted model fails the call
    plan = make_plan(REQUEST, config, no_context)
    assert plan.fallback
    assert plan.problems[0].startswith("the planner call failed")


def test_questions_and_single_actions_call_no_model(tmp_path: Path) -> None:
    config = planner_config(tmp_path)  # it would fail if called

    def context(_: Classification) -> RepositoryContext:
        raise AssertionError("the repository is read only for the planner")

    question = make_plan("What does geo.py do?", config, context)
    assert (question.steps, question.planned, question.fallback) == ([], False, False)
    single = make_plan("Fix the typo in geo.py", config, context)
    assert [(s.id, s.step_type.value) for s in single.steps] == [("fix-the-typo-in", "Debug")]


@pytest.fixture
def repo_with_planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    script = yaml.safe_dump({"rules": [{"match": "geo.py", "reply": {"content": GOOD}}]})
    toml = '[[tiers]]\nname = "local"\nmodel = "scripted/planner.yaml"\nprice_in = 2.0\n'
    files = {"geo.py": "X = 1\n", "planner.yaml": script, "merlin.toml": toml}
    return make_repo(tmp_path / "repo", files)


def test_merlin_plan_prints_json_and_writes_a_tasklist(
    repo_with_planner: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan.yaml"
    runner = CliRunner()
    result = runner.invoke(
        app, ["plan", REQUEST, "--repo", str(repo_with_planner), "--json", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {k: data[k] for k in ("request", "kind", "planned", "fallback", "complexity")} == {
        "request": REQUEST, "kind": "task", "planned": True, "fallback": False,
        "complexity": "medium",
    }  # fmt: skip
    steps = data["tasklist"]["steps"]
    assert [(s["id"], s["instruction"], s["estimated_tokens"]) for s in steps] == [
        ("point", "Add a Point class to geo.py", 20000),
        ("tests", "Add tests", 10000),
    ]
    written = load_tasklist(out)
    assert [(s.id, s.depends_on) for s in written.steps] == [("point", []), ("tests", ["point"])]
    table = runner.invoke(app, ["plan", REQUEST, "--repo", str(repo_with_planner)])
    assert table.exit_code == 0, table.output
    assert "planned by tier local" in table.stdout
    assert "$0.0400 (local)" in table.stdout  # 20,000 tokens at $2 per million
    assert "$0.0600" in table.stdout  # the total


def test_merlin_plan_refuses_what_it_cannot_plan(repo_with_planner: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["plan", "Refactor @nope.py", "--repo", str(repo_with_planner)])
    assert missing.exit_code == 2
    assert "names @nope.py, which is not in the repository" in missing.output
    question = runner.invoke(
        app, ["plan", "What is X?", "--repo", str(repo_with_planner), "--out", str(tmp_path / "q")]
    )
    assert question.exit_code == 2
    assert "a question has no plan to write" in question.output
    assert not (tmp_path / "q").exists()
    empty = runner.invoke(app, ["plan", "  ", "--repo", str(repo_with_planner)])
    assert empty.exit_code == 2


def test_the_written_tasklist_carries_no_generated_id(
    repo_with_planner: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan.yaml"
    result = CliRunner().invoke(
        app, ["plan", REQUEST, "--repo", str(repo_with_planner), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "id" not in yaml.safe_load(out.read_text())
    assert f"written to {out}" in result.stdout
