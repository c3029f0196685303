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
    rules = [
        {"match": "You answer questions", "turn": 0, "reply": GREP},
        {"match": "You answer questions", "turn": 1, "reply": answer},
    ]
    return make_repo(
        tmp_path / "repo",
        {
            "app.py": "def answer():\n    return 41\n",
            "local.yaml": yaml.safe_dump({"rules": rules}),
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n',
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


def test_following_gives_each_line_once_in_order_and_ends_with_the_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    import json

    from merlin_flow.engine.attempt import execute_step
    from merlin_flow.engine.finalize import finalize_job
    from merlin_flow.engine.verdict import verify_step
    from merlin_flow.jobs.logs import follow_log
    from tests.unit.scripted_jobs import scripted_job

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    work = [  # what the workers do between two polls
        lambda: execute_step(db, settings, job_id, "s0", "w:1"),
        lambda: verify_step(db, settings, job_id, "s0", "w:2"),
        lambda: finalize_job(db, settings, job_id),
    ]
    polls: list[int] = []
    lines: list[dict[str, object]] = []

    def between_polls(seconds: float) -> None:
        polls.append(len(lines))
        work.pop(0)()

    for line in follow_log(db, job_id, poll=0.01, sleep=between_polls):
        json.dumps(line)  # every line is JSON as it is
        assert {"type", "job", "step", "attempt"} <= set(line), line
        assert line["job"] == job_id
        lines.append(line)
    assert work == []  # it followed the job to its end, and no further
    kinds = [line["type"] for line in lines]
    assert kinds[-1] == "job_end"
    assert (lines[-1]["status"], lines[-1]["branch"]) == ("completed", f"merlin/{job_id}")
    first, *_ = [n for n, kind in enumerate(kinds) if kind == "attempt_start"]
    # the attempt was committed (not yet verified) at the second poll: its start, its
    # messages in order, and its end only at the third, after the verification
    assert polls[0] <= first < polls[1]
    messages = [line for line in lines if line["type"] == "message"]
    assert [m["index"] for m in messages] == list(range(len(messages)))
    assert {(m["step"], m["attempt"]) for m in messages} == {("s0", 1)}
    roles = [m["message"]["role"] for m in messages]  # type: ignore[index]
    assert roles[:2] == ["user", "assistant"]
    [end] = [line for line in lines if line["type"] == "attempt_end"]
    assert (end["step"], end["attempt"], end["status"]) == ("s0", 1, "passed")
    assert (end["exit_code"], end["kind"], end["tier"]) == (0, "execute", "local")
    assert kinds.index("attempt_end") > max(n for n, k in enumerate(kinds) if k == "message")
    assert polls[1] <= kinds.index("attempt_end") < polls[2]
    events = {line["kind"]: line for line in lines if line["type"] == "event"}
    assert {"job_submitted", "attempt_started", "job_finished"} <= set(events)
    assert (events["attempt_started"]["step"], events["attempt_started"]["attempt"]) == ("s0", 1)
    assert events["job_submitted"]["step"] is None
    assert kinds.index("event") < first  # the attempt_started event came before its lines
    # a job that has ended: the same lines at once (its events first), job_end last, no wait
    again = list(follow_log(db, job_id, sleep=lambda _: pytest.fail("it waited")))
    assert sorted(str(line["type"]) for line in again) == sorted(str(kind) for kind in kinds)
    assert [line for line in again if line["type"] == "message"] == messages
    assert again[-1]["type"] == "job_end"
    # The reference's example lines have the fields of real ones (`...` ends a shortened one).
    reference = (Path(__file__).parents[3] / "docs" / "reference.md").read_text()
    example = reference.split("For example (shortened):\n\n```text\n", 1)[1].split("```", 1)[0]
    for text in example.splitlines():
        shortened = text.endswith(", ...}")
        shown = json.loads(text.removesuffix(", ...}") + ("}" if shortened else ""))
        real = next(
            line for line in lines
            if line["type"] == shown["type"] and line.get("kind", "") == shown.get("kind", "")
        )  # fmt: skip
        assert set(shown) <= set(real) if shortened else set(shown) == set(real), text


def test_following_an_attempt_that_restarted_says_so_and_gives_its_messages_again() -> None:
    from typing import Any

    from merlin_flow.jobs.logs import _attempt_lines

    entry: Any = {"step": "fix", "number": 2, "status": "running", "transcript": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
    ]}  # fmt: skip
    shown: dict[tuple[str, int], int] = {}
    closed: set[tuple[str, int]] = set()
    first = list(_attempt_lines("j", entry, shown, closed))
    assert [line["type"] for line in first] == ["attempt_start", "message", "message"]
    restarted = {**entry, "transcript": entry["transcript"][:1]}  # its worker was lost
    again = list(_attempt_lines("j", restarted, shown, closed))
    assert [(line["type"], line.get("index")) for line in again] == [
        ("attempt_restarted", None), ("message", 0),
    ]  # fmt: skip
    ended = {**restarted, "status": "failed"}
    assert [line["type"] for line in _attempt_lines("j", ended, shown, closed)] == ["attempt_end"]
    assert list(_attempt_lines("j", ended, shown, closed)) == []  # its end is given once


def test_a_questions_citations_are_checked_and_kept_with_its_plan(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    from merlin_flow.jobs.views import job_view

    answer = {"content": "It returns 41 (app.py:2 `return 41`), not 42 (app.py:9)."}
    made = submit_request(db, settings, "What does answer() return?", str(_repo(tmp_path, answer)))
    view = job_view(db, made.job_id)
    assert [(c["citation"], c["ok"], c["problem"]) for c in view["plan"]["citations"]] == [
        ("app.py:2", True, None),
        ("app.py:9", False, "line 9 is past the end (2 lines)"),
    ]
    assert view["answer"] == (
        "It returns 41 (app.py:2 `return 41`), not 42 (app.py:9 [citation invalid: line 9 is "
        "past the end (2 lines)])."
    )
