"""Condensation: masking first, then a summary that fits, the plan pinned (agents.condense)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

from merlin_flow.agents.condense import (
    KEEP_WHOLE,
    SUMMARY_SHARE,
    Condenser,
    changes_so_far,
    limit,
    mask,
)
from merlin_flow.models.scripted import replies_condensed, turn_of
from merlin_flow.models.tokens import conversation_text

WINDOW = 4000
HEAD = [
    {"role": "system", "content": "You are merlin."},
    {"role": "user", "content": "Step s1 (Debug): fix parse_rows\nExit command: pytest -q"},
]


def count(messages: list[dict[str, Any]]) -> int:
    return sum(math.ceil(len(conversation_text([m])) / 4) + 4 for m in messages)


def text_count(text: str) -> int:
    return math.ceil(len(text) / 4)


def exchange(n: int, answer: str, thought: str = "") -> list[dict[str, Any]]:
    arguments = json.dumps({"path": f"f{n}.py"})
    call = {"id": f"c{n}", "type": "function",
            "function": {"name": "read_file", "arguments": arguments}}  # fmt: skip
    return [
        {"role": "assistant", "content": thought, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": answer},
    ]


def condenser(summaries: list[list[dict[str, Any]]], reply: str | None = "SUMMARY") -> Condenser:
    def summarise(request: list[dict[str, Any]], tokens: int) -> str | None:
        summaries.append(request)
        return reply

    return Condenser(WINDOW, 256, count, text_count, lambda: "PINNED: todo, changes", summarise)


def test_a_conversation_under_the_limit_is_left_alone() -> None:
    messages = [*HEAD, *exchange(0, "x" * 400)]
    before = [dict(m) for m in messages]
    assert condenser([]).fit(messages) is None
    assert messages == before


def test_masking_keeps_the_newest_answers_whole_and_names_the_tool_of_the_others() -> None:
    messages = [*HEAD]
    for n in range(KEEP_WHOLE + 4):
        messages += exchange(n, f"answer {n} " + "y" * (3000 if n < 4 else 100))
    summaries: list[list[dict[str, Any]]] = []
    done = condenser(summaries).fit(messages)
    assert done is not None
    assert done.how == "masked"
    assert summaries == []
    answers = [m["content"] for m in messages if m["role"] == "tool"]
    assert all(a.startswith("[merlin: this output of read_file") for a in answers[:4])
    assert all(a.startswith(f"answer {n + 4} ") for n, a in enumerate(answers[4:]))
    assert done.masked == 4
    assert done.after <= done.before
    assert done.after < limit(WINDOW, 256)


def test_old_long_arguments_are_masked_with_old_answers() -> None:
    messages = [*HEAD, *exchange(0, "z" * 3000)]
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"content": "w" * 900})
    for n in range(1, KEEP_WHOLE + 1):
        messages += exchange(n, "ok")
    assert mask(messages, KEEP_WHOLE) == 2
    arguments = json.loads(messages[2]["tool_calls"][0]["function"]["arguments"])
    assert arguments["merlin"].startswith("[merlin: this call's arguments (")


def test_a_summary_replaces_the_middle_and_the_prompt_is_rebuilt_with_the_pinned_facts() -> None:
    messages = [*HEAD]
    for n in range(30):
        messages += exchange(n, f"answer {n}", thought="thinking " * 60)
    summaries: list[list[dict[str, Any]]] = []
    done = condenser(summaries).fit(messages)
    assert done is not None
    assert done.how == "summarised"
    assert done.condensed > 0
    assert messages[:2] == HEAD  # the system prompt and the brief, word for word
    note = messages[2]["content"]
    assert replies_condensed(messages[2]) == done.condensed // 2  # a reply and its answer
    assert turn_of(messages) == 30  # the scripted model's count goes on where it was
    assert "SUMMARY" in note
    assert "PINNED: todo, changes" in note
    assert messages[3]["role"] == "assistant"  # a tool answer never opens the tail
    assert messages[-1] == exchange(29, "answer 29")[1]  # the latest exchange kept
    assert count(messages) <= WINDOW * 0.5
    (request,) = summaries
    assert count(request) <= WINDOW * SUMMARY_SHARE  # never too long to condense


def test_a_huge_middle_is_cut_to_fit_the_summary_call_newest_first() -> None:
    messages = [*HEAD]
    for n in range(200):
        messages += exchange(n, f"answer {n} " + "q" * 300, thought=f"step {n}")
    summaries: list[list[dict[str, Any]]] = []
    condenser(summaries).fit(messages)
    log = summaries[0][1]["content"]
    assert count(summaries[0]) <= WINDOW * SUMMARY_SHARE
    assert log.splitlines()[0].endswith("older entries left out]")
    kept = re.findall(r"^assistant: step (\d+)$", log, re.M)
    assert kept == [str(n) for n in range(int(kept[0]), int(kept[-1]) + 1)]  # newest, in order
    assert int(kept[0]) > 0


def test_an_earlier_summary_goes_into_the_next_one() -> None:
    messages = [*HEAD]
    for n in range(30):
        messages += exchange(n, f"answer {n}", thought="thinking " * 60)
    summaries: list[list[dict[str, Any]]] = []
    condenser(summaries).fit(messages)
    for n in range(30, 60):
        messages += exchange(n, f"answer {n}", thought="thinking " * 60)
    condenser(summaries).fit(messages)
    earlier = summaries[1][1]["content"]
    assert earlier.startswith("user: [merlin: ")
    assert "SUMMARY" in earlier.split("\n\n")[1]
    assert turn_of(messages) == 60


def test_a_failed_summary_drops_the_middle_and_says_so() -> None:
    messages = [*HEAD]
    for n in range(30):
        messages += exchange(n, f"answer {n}", thought="thinking " * 60)
    done = condenser([], reply=None).fit(messages)
    assert done is not None
    assert done.how == "dropped"
    assert "earlier messages were dropped" in messages[2]["content"]
    assert "PINNED" in messages[2]["content"]
    assert count(messages) <= WINDOW * 0.5


def test_a_forced_condensation_condenses_under_the_limit_too() -> None:
    messages = [*HEAD]
    for n in range(KEEP_WHOLE + 2):
        messages += exchange(n, "v" * 200)
    done = condenser([]).fit(messages, force=True)
    assert done is not None
    assert done.forced
    assert done.how == "masked"
    assert "after the provider refused" in done.describe()


def test_changes_so_far_lists_changed_and_new_files(tmp_path: Path) -> None:
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True)  # fmt: skip
    assert changes_so_far(tmp_path) == "(no changes yet)"
    (tmp_path / "new.py").write_text("x = 1\n")
    assert changes_so_far(tmp_path).splitlines()[0] == "?? new.py"
    assert changes_so_far(tmp_path / "missing").startswith("(git could not tell")


def test_a_conversation_with_nothing_to_summarise_is_left_as_masking_left_it() -> None:
    messages = [HEAD[0], {"role": "user", "content": "a brief of many words " * 1000}]
    summaries: list[list[dict[str, Any]]] = []
    done = condenser(summaries).fit(messages, force=True)
    assert done is not None
    assert (done.how, done.condensed, summaries) == ("masked", 0, [])
    assert len(messages) == 2  # no note added for nothing condensed


def test_a_middle_smaller_than_its_note_is_not_summarised() -> None:
    # The brief alone passes the limit; between it and the latest messages lie two short
    # exchanges, less than a note (opening, summary, pinned facts) would take.
    brief = {"role": "user", "content": "a brief of many words " * 700}
    messages = [HEAD[0], brief, *exchange(0, "short"), *exchange(1, "short")]
    before = [dict(m) for m in messages]
    summaries: list[list[dict[str, Any]]] = []
    assert condenser(summaries).fit(messages) is None  # no call, no event
    assert summaries == []
    assert messages == before
