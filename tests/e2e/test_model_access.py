"""A tier whose key is missing: its attempt fails at once, with no call, and no fix attempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import merlin, merlin_env, write_job_files
from tests.e2e.test_run import ONE_STEP, PREMIUM_RIGHT

pytestmark = pytest.mark.e2e


def test_missing_key_escalates_without_a_call_or_a_fix(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    env.pop("OPENAI_API_KEY", None)
    tasklist, config = write_job_files(tmp_path / "job", premium=PREMIUM_RIGHT, tasklist=ONE_STEP)
    text = config.read_text().replace('model = "scripted/local.yaml"', 'model = "openai/gpt-4o"')
    config.write_text(text + "\n[environment]\nsetup = []\n")
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    view = json.loads(result.stdout)
    (step,) = view["steps"]
    first, second = step["attempts"]  # fix_attempts = 1, yet no fix attempt on "local"
    assert (first["tier"], first["status"]) == ("local", "error")
    assert "OPENAI_API_KEY" in first["error"]
    assert first["prompt_tokens"] == 0  # no call was made
    assert (second["kind"], second["tier"], second["status"]) == ("escalate", "premium", "passed")
