"""deploy/ci/merlin-github.yml's own steps, as a runner runs them: its install line in a
fresh virtual environment (merlin from this repository at its HEAD commit, through git,
as `git+${MERLIN_SOURCE}@${MERLIN_COMMIT}` says), then its `merlin github` step on a
labelled issue against the fake GitHub: the plan is posted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import make_repo
from tests.e2e.helpers import LOCAL_SCRIPT, write_job_files
from tests.e2e.test_github import KEY, labelled
from tests.e2e.test_requests import PLANNER_RULES, REQUEST
from tests.github_server import FakeGitHub, fake_github

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _steps() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    workflow = yaml.safe_load((ROOT / "deploy" / "ci" / "merlin-github.yml").read_text())
    job = workflow["jobs"]["merlin"]
    return job["env"], {step.get("name", ""): step for step in job["steps"]}


def _bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A `run:` step: bash -e, as GitHub runs it."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


@pytest.mark.timeout(1200)
def test_the_workflows_install_and_answer_steps_run_in_a_fresh_venv(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("needs this repository's git history to install from")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    job_env, steps = _steps()
    venv = tmp_path / "venv"  # the runner's setup-python: a current pip
    subprocess.run([sys.executable, "-m", "venv", "--upgrade-deps", str(venv)], check=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MERLIN_", "VIRTUAL_ENV"))}
    env = {**base, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "MERLIN_SOURCE": f"file://{ROOT}", "MERLIN_COMMIT": head}  # fmt: skip
    assert set(job_env) == {"MERLIN_SOURCE", "MERLIN_COMMIT"}  # all the test replaces
    installed = _bash(steps["Install merlin"]["run"], env, tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    located = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import merlin_flow; print(merlin_flow.__file__)"],
                             cwd=tmp_path, capture_output=True, text=True,
                             check=True)  # fmt: skip
    assert located.stdout.startswith(str(venv))

    with fake_github(FakeGitHub(login=None)) as fake:
        workspace = make_repo(  # the repository the workflow checked out
            tmp_path / "workspace",
            {"app.py": "def answer():\n    return 41\n",
             "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n'},
        )  # fmt: skip
        _, config = write_job_files(
            tmp_path / "job", local=LOCAL_SCRIPT.replace("rules:\n", "rules:\n" + PLANNER_RULES)
        )
        event = tmp_path / "event.json"
        event.write_text(json.dumps(labelled(fake, 7, REQUEST)))
        answer = steps["Answer the event"]
        step_env = {
            **env,
            "GITHUB_EVENT_NAME": "issues", "GITHUB_EVENT_PATH": str(event),
            "GITHUB_REPOSITORY": fake.repository, "GITHUB_API_URL": fake.url,
            "GITHUB_WORKSPACE": str(workspace), "GITHUB_TOKEN": "ghs_fake",
            "MERLIN_PLAN_KEY": KEY, "MERLIN_HOME": str(tmp_path / "runner-temp" / "merlin"),
            "MERLIN_CONFIG": str(config),  # the team's tiers: here, scripted
        }  # fmt: skip
        assert set(answer["env"]) - set(step_env) <= {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
        answered = _bash(answer["run"], step_env, workspace)
        assert answered.returncode == 0, answered.stderr[-3000:]
        [plan] = fake.thread(7)
    assert plan["body"].startswith("### merlin's plan: ")
    assert "<!-- merlin-plan v1 " in plan["body"]
