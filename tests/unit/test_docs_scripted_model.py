"""docs/scripted-model.md's tables stay true: the prompts' first words, each kind's feedback.

Its examples are run by ``tests/e2e/test_docs_scripted_model.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from merlin_flow.agents.loop import SYSTEM_PROMPT
from merlin_flow.engine.feedback import feedback_for
from merlin_flow.failures import AttemptKind
from merlin_flow.planning.planner import PLANNER_PROMPT
from merlin_flow.planning.questions import QUESTION_PROMPT
from merlin_flow.planning.reading import repair_prompt
from merlin_flow.planning.spec_check import CHECK_PROMPT
from tests.unit.attempts import attempt

PAGE = (Path(__file__).parents[2] / "docs" / "scripted-model.md").read_text()
TEMPLATE = re.search(r"told as `(.+?)`,\s+then, when a command failed, `(.+?)`", PAGE)
assert TEMPLATE is not None
TOLD = (
    re.escape(TEMPLATE.group(1)).replace("N", r"\d+").replace("<kind>", r"\w+")
    .replace("<tier>", r"\w+").replace("<reason>", ".+")
    + "\n" + re.escape(TEMPLATE.group(2)) + "\n"
)  # fmt: skip


def _table_after(words: str) -> list[list[str]]:
    """The body rows of the first table after ``words``, as lists of cells."""
    lines = PAGE.split(words, 1)[1].splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2 :]:  # after the header and its rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _quoted(cell: str) -> str:
    """The first `code` in a cell."""
    found = re.search(r"`([^`]+)`", cell)
    assert found is not None, cell
    return found.group(1)


def test_each_conversation_starts_as_the_page_says() -> None:
    rows = _table_after("## What the conversation contains")
    starts = {row[0]: _quoted(row[2]) for row in rows}
    prompts = {
        "A step's attempt": SYSTEM_PROMPT,
        "planner": PLANNER_PROMPT,
        "question": QUESTION_PROMPT,
        "spec check": CHECK_PROMPT,
    }
    assert len(starts) == len(prompts)
    for conversation, start in starts.items():
        (prompt,) = (text for name, text in prompts.items() if name in conversation)
        assert prompt.startswith(start), conversation  # what a `match: '^...'` finds


@pytest.mark.parametrize("kind", list(AttemptKind))
def test_each_attempt_kind_has_the_feedback_the_page_says(kind: AttemptKind) -> None:
    rows = {_quoted(row[0]): row for row in _table_after("`Earlier attempts at this step failed:`")}
    assert set(rows) == {kind.value for kind in AttemptKind}
    failed = attempt(1, AttemptKind.EXECUTE, tier="cheap", output_tail="1 failed in 0.02s")
    feedback = feedback_for(kind, [failed])
    ends_with = rows[kind.value][2]
    if ends_with == "—":
        assert feedback is None
        return
    assert feedback is not None
    assert re.match(TOLD, feedback), feedback  # a failure, told as the page says
    assert feedback.endswith(_quoted(ends_with))


def test_the_repair_request_starts_as_the_page_says() -> None:
    said = re.search(r"that starts\s+`([^`]+)`", PAGE)
    assert said is not None
    assert repair_prompt(["The plan has no steps."]).startswith(said.group(1))
