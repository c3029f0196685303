"""deploy/ci/: the GitHub workflows validate, pass zizmor offline with no high finding, and
keep the rules a copied workflow needs (pinned actions, least permissions, no expression
in a shell script, merlin installed from a pinned commit, the token kept out of git)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / "deploy" / "ci").glob("*.yml"))
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def _load(path: Path) -> dict[str, Any]:
    workflow: dict[str, Any] = yaml.safe_load(path.read_text())
    return workflow


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def rule_breaks(workflow: dict[str, Any]) -> list[str]:
    """What a shipped workflow must not do, as a list of problems."""
    problems = []
    if workflow.get("permissions") != {}:
        problems.append("top-level permissions are not {}")
    for name, job in workflow["jobs"].items():
        if not job.get("permissions"):
            problems.append(f"job {name}: no permissions of its own")
    for step in _steps(workflow):
        uses, run = step.get("uses"), step.get("run", "")
        if uses and not PINNED.match(uses):
            problems.append(f"{uses}: not pinned to a commit")
        keeps = step.get("with", {}).get("persist-credentials") is not False
        if uses and uses.startswith("actions/checkout@") and keeps:
            problems.append("checkout keeps the token in .git/config")
        if "${{" in run:
            problems.append(f"step {step.get('name')!r}: an expression inside run:")
        if re.search(r"pip install[^\n]*merlin-flow(\[|\"|'|\s|$)(?!\s*@)", run):
            problems.append(f"step {step.get('name')!r}: installs merlin-flow from the index")
        if "x-access-token:" in run and "@github.com" in run:
            problems.append(f"step {step.get('name')!r}: a token in a URL")
    return problems


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflow_validates_against_the_github_workflow_schema(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema",
         "vendor.github-workflows", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_the_workflow_keeps_the_rules(path: Path) -> None:
    workflow = _load(path)
    assert rule_breaks(workflow) == []
    install = next(s["run"] for s in _steps(workflow) if s.get("name") == "Install merlin")
    assert install == 'python -m pip install "merlin-flow @ git+${MERLIN_SOURCE}@${MERLIN_COMMIT}"'
    env = next(iter(workflow["jobs"].values()))["env"]
    assert re.fullmatch(r"[0-9a-f]{40}", env["MERLIN_COMMIT"])


def test_the_rules_catch_what_the_old_workflow_did() -> None:
    old = {
        "permissions": {"contents": "read"},
        "jobs": {"refactor": {"steps": [
            {"uses": "actions/checkout@v4"},
            {"name": "Install", "run": 'pip install "merlin-flow[postgres]"'},
            {"name": "PR", "run": 'git push "https://x-access-token:${T}@github.com/${{ '
                                  'github.repository }}.git"'},
        ]}},
    }  # fmt: skip
    assert rule_breaks(old) == [
        "top-level permissions are not {}",
        "job refactor: no permissions of its own",
        "actions/checkout@v4: not pinned to a commit",
        "checkout keeps the token in .git/config",
        "step 'Install': installs merlin-flow from the index",
        "step 'PR': an expression inside run:",
        "step 'PR': a token in a URL",
    ]


def test_zizmor_finds_nothing_high_offline() -> None:
    result = subprocess.run(
        ["zizmor", "--offline", "--min-severity", "high", "--format", "plain",
         *map(str, WORKFLOWS)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_zizmor_would_see_a_high_finding(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    text = (ROOT / "deploy" / "ci" / "merlin-github.yml").read_text()
    broken.write_text(text.replace("# zizmor: ignore[dangerous-triggers]", ""))
    result = subprocess.run(
        ["zizmor", "--offline", "--min-severity", "high", "--format", "plain", str(broken)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "dangerous-triggers" in result.stdout + result.stderr


def test_the_github_workflow_listens_to_what_merlin_github_handles() -> None:
    from merlin_flow.github.events import EVENTS

    workflow = _load(ROOT / "deploy" / "ci" / "merlin-github.yml")
    assert set(workflow[True]) == set(EVENTS)  # YAML 1.1 reads the key `on` as a boolean
    steps = {step.get("name"): step for step in _steps(workflow)}
    answer = steps["Answer the event"]
    assert answer["run"] == "merlin github --out merlin-out"
    assert {"MERLIN_PLAN_KEY", "GITHUB_TOKEN", "MERLIN_HOME"} <= set(answer["env"])
    assert "apparmor_parser" in steps["Install bubblewrap (each step's sandbox)"]["run"]
