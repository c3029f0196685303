"""Answering a question: the answer's citations checked at the commit it was asked at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.models.llm import Completion
from merlin_flow.planning.questions import Answer, answer_question
from merlin_flow.tool_config import AgentSettings
from merlin_flow.workspace.repository import JobRepository
from tests.conftest import git, make_repo

ANSWER = "answer() returns 41: app.py:2 `return 41`. It is defined at app.py:1, not app.py:7."
MARKED = (
    "answer() returns 41: app.py:2 `return 41`. It is defined at app.py:1, not app.py:7"
    " [citation invalid: line 7 is past the end (2 lines)]."
)


def _ask(tmp_path: Path, reply: str, citations: Any) -> Answer:
    """Ask about a repository whose ``app.py`` changed after ``base``; the model says ``reply``."""
    path = make_repo(tmp_path / "repo", {"app.py": "def answer():\n    return 41\n"})
    base = git(path, "rev-parse", "HEAD")
    (path / "app.py").write_text("\n" * 10)  # not committed: never seen at ``base``
    config = MerlinConfig(
        tiers=[Tier(name="t", model="openai/m")], agents=AgentSettings(citations=citations)
    )

    def model(_tier: Tier, _messages: list[dict[str, Any]], _tools: Any) -> Completion:
        message = {"role": "assistant", "content": reply}
        return Completion(message, 10, 10, 0.0, 1.0, "hash")

    repository = JobRepository(str(path), path, tmp_path / "scratch")
    return answer_question(repository, base, config, "What does answer() return?", model)


def test_an_answers_invalid_citations_are_marked_and_kept(tmp_path: Path) -> None:
    answer = _ask(tmp_path, ANSWER, "check")
    assert (answer.text, answer.error) == (MARKED, None)
    assert answer.citations == [
        {"citation": "app.py:2", "ok": True, "problem": None, "snippet": "return 41"},
        {"citation": "app.py:1", "ok": True, "problem": None, "snippet": None},
        {
            "citation": "app.py:7",
            "ok": False,
            "problem": "line 7 is past the end (2 lines)",
            "snippet": None,
        },
    ]


def test_enforced_citations_fail_an_answer_whose_citations_do_not_hold(tmp_path: Path) -> None:
    answer = _ask(tmp_path, ANSWER, "enforce")
    assert answer.text is None
    assert answer.error == (
        'the answer\'s citations do not hold (1 invalid; [agents] citations = "enforce"): '
        "app.py:7: line 7 is past the end (2 lines)"
    )
    assert [c["ok"] for c in answer.citations] == [True, True, False]
    assert answer.transcript[-1]["content"] == ANSWER  # what was said stays in the log


@pytest.mark.parametrize("mode", ["check", "enforce"])
def test_an_answer_whose_citations_hold_is_kept_as_written(tmp_path: Path, mode: Any) -> None:
    reply = "It returns 41 (app.py:1-2)."
    answer = _ask(tmp_path, reply, mode)
    assert (answer.text, answer.error) == (reply, None)
    assert answer.citations == [
        {"citation": "app.py:1-2", "ok": True, "problem": None, "snippet": None}
    ]
