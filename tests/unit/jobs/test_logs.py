"""What ``merlin logs`` reads: each attempt's conversation, and a question's as one attempt."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from merlin_flow.errors import InputError, JobNotFoundError
from merlin_flow.jobs.logs import QUESTION, job_logs, tool_call_line
from merlin_flow.jobs.requesting import submit_request
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.conftest import make_repo

GREP = {"tool_calls": [{"name": "grep", "arguments": {"pattern": "return 4"}}]}


def _repo(tmp_path: Path, answer: dict[str, object]) -> Path:
    """A repository whose one scripted tier greps, then answers with ``answer``."""
    script = tmp_path / "local.yaml"
    rules = [
        {"match": "You answer questions", "turn": 0, "reply": GREP},
        {"match": "You answer questions", "turn": 1, "reply": answer},
    ]
    script.write_text(yaml.safe_dump({"rules": rules}))
    return make_repo(
        tmp_path / "repo",
        {
            "app.py": "def answer():\n    return 41\n",
            "merlin.toml": f'[[tiers]]\nname = "local"\nmodel = "scripted/{script}"\n',
        },
    )


def test_a_question_is_one_attempt_with_its_conversation(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    repo = _repo(tmp_path, {"content": "It returns 41."})
    made = submit_request(db, settings, "What does answer() return?", str(repo))
    [entry] = job_logs(db, made.job_id)
    assert (entry["step"], entry["status"], entry["tier"], entry["turns"]) == (
        QUESTION, "passed", "local", 2,
    )  # fmt: skip
    roles = [m["role"] for m in entry["transcript"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert "app.py:2" in entry["transcript"][2]["content"]  # the grep's result is journaled
    assert entry["prompt_tokens"] > 0
    assert job_logs(db, made.job_id, QUESTION) == [entry]


def test_a_question_the_model_failed_is_an_error_with_its_reason(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    repo = _repo(tmp_path, {"error": "AuthenticationError"})
    made = submit_request(db, settings, "What does answer() return?", str(repo))
    [entry] = job_logs(db, made.job_id)
    assert entry["status"] == "error"
    assert "AuthenticationError" in (entry["error"] or "")
    assert [m["role"] for m in entry["transcript"]][:3] == ["user", "assistant", "tool"]


def test_an_unknown_job_or_step_is_named(db: Database, settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(JobNotFoundError, match="nope"):
        job_logs(db, "nope")
    repo = _repo(tmp_path, {"content": "41"})
    made = submit_request(db, settings, "What does answer() return?", str(repo))
    with pytest.raises(InputError, match="no step 'fix'"):
        job_logs(db, made.job_id, "fix")


def test_the_latest_tool_call_is_one_line() -> None:
    call = {"function": {"name": "run_command", "arguments": '{"command": "pytest -q"}'}}
    other = {"function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [other, call]},
        {"role": "tool", "content": "1 passed"},
    ]
    assert tool_call_line(messages) == 'run_command {"command": "pytest -q"}'
    assert tool_call_line(messages[:1]) is None
