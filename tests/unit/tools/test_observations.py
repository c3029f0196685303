"""Bounded tool answers, read_output and the todo list (merlin_flow.tools.observations)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from merlin_flow.tools.observations import MAX_CHARS, MAX_LINES, Observations, TodoList


def estimate(text: str) -> int:
    return math.ceil(len(text) / 4)


def test_a_short_answer_is_kept_whole() -> None:
    observations = Observations(100_000, estimate)
    assert observations.bound("exit code: 0\nok", "run_command") == "exit code: 0\nok"


def test_a_long_answer_keeps_head_and_tail_and_can_be_paged_whole() -> None:
    log = "\n".join(f"line {n}" for n in range(1, 5001))
    observations = Observations(100_000, estimate)
    kept = observations.bound(log, "run_command")
    lines = kept.splitlines()
    assert lines[0] == "line 1"
    assert lines[-1] == "line 5000"
    assert len(lines) <= MAX_LINES + 1
    assert len(kept) <= MAX_CHARS + 400
    note = next(line for line in lines if line.startswith("[merlin:"))
    assert "run_command's output cut to fit the context" in note
    assert "of 5000 shown" in note
    head = lines.index(note)
    page = observations.read_output(1, start_line=head + 1)
    header, first = page.splitlines()[:2]
    assert header.startswith(f"output 1: lines {head + 1}-")
    assert first.split("\t") == [str(head + 1), f"line {head + 1}"]
    # Paging on from each page's end reads every line, in order, once.
    seen, start = [], 1
    while True:
        page = observations.read_output(1, start_line=start)
        body = page.splitlines()[1:]
        seen += [line.split("\t", 1)[1] for line in body]
        if "goes on" not in page.splitlines()[0]:
            break
        start += len(body)
    assert seen == log.splitlines()


def test_the_budget_is_a_share_of_a_small_window() -> None:
    observations = Observations(4096, estimate)
    kept = observations.bound("x" * 50_000, "grep")
    assert estimate(kept) <= 4096 * 0.05


def test_read_output_errors_name_the_problem() -> None:
    observations = Observations(100_000, estimate)
    assert observations.read_output(3) == "error: no output 3; saved outputs: none"
    observations.bound("\n".join(["x"] * 1000), "grep")
    assert observations.read_output(1, start_line=2000) == (
        "error: start_line 2000 is past the end: output 1 has 1000 lines"
    )


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(min_value=1024, max_value=300_000),
    lines=st.lists(st.text(max_size=3000), max_size=400),
)
def test_no_answer_is_kept_over_its_budget(window: int, lines: list[str]) -> None:
    observations = Observations(window, estimate)
    kept = observations.bound("\n".join(lines), "run_command")
    assert estimate(kept) <= observations.tokens


def test_the_todo_list_is_replaced_whole_and_rendered() -> None:
    todo = TodoList()
    reply = todo.set([{"text": "find the bug", "state": "done"}, {"text": "fix it"}])
    assert reply == "[x] find the bug\n[ ] fix it"
    todo.set([{"text": "fix it", "state": "in_progress"}])
    assert todo.render() == "[~] fix it"
    assert todo.set("nope").startswith("error: items must be a list")
    assert todo.set([{"text": "x", "state": "later"}]).startswith("error: item 1's state")
    assert todo.set([{"state": "done"}]) == "error: item 1 has no text"
    assert todo.render() == "[~] fix it"  # a refused call changes nothing
