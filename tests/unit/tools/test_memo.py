"""Duplicate reads: a repeated read of an unchanged file answered with where it was read."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.tool_config import Sandbox
from merlin_flow.tools.toolbox import Toolbox
from merlin_flow.workspace.checkout import Checkout
from tests.unit.tools.conftest import World

# --- duplicate calls -----------------------------------------------------------------------

# (turn, tool, arguments, expected reply: exact, or a prefix ending in "...")
Step = tuple[int, str, dict[str, Any], str]
A = {"path": "a.txt"}
A_TEXT = "hello\nworld\n"
SAME = "unchanged since turn {}: a.txt is as you read it then"
DUPLICATES: dict[str, list[Step]] = {
    "again-next-turn": [(0, "read_file", A, A_TEXT), (1, "read_file", A, SAME.format(0))],
    "again-same-turn": [(2, "read_file", A, A_TEXT), (2, "read_file", A, SAME.format(2))],
    "at-the-window-edge": [(0, "read_file", A, A_TEXT), (8, "read_file", A, SAME.format(0))],
    "past-the-window": [(0, "read_file", A, A_TEXT), (9, "read_file", A, A_TEXT)],
    "a-suppressed-read-does-not-refresh": [
        (0, "read_file", A, A_TEXT),
        (6, "read_file", A, SAME.format(0)),
        (9, "read_file", A, A_TEXT),
        (10, "read_file", A, SAME.format(9)),
    ],
    "changed-by-a-command": [
        (0, "read_file", A, A_TEXT),
        (1, "run_command", {"command": "echo more >> a.txt"}, "exit code: 0..."),
        (2, "read_file", A, A_TEXT + "more\n"),
    ],
    "written-back-to-what-was-read": [
        (0, "read_file", A, A_TEXT),
        (1, "write_file", {**A, "content": "other\n"}, "wrote 6 characters to a.txt"),
        (2, "write_file", {**A, "content": A_TEXT}, "wrote 12 characters to a.txt"),
        (3, "read_file", A, A_TEXT),
    ],
    "another-range": [
        (0, "read_file", {**A, "start_line": 1, "end_line": 1}, "a.txt: lines 1-1 of 2\n1\thello"),
        (1, "read_file", {**A, "start_line": 1, "end_line": 2}, "a.txt: lines 1-2 of 2..."),
        (2, "read_file", A, A_TEXT),
        (
            3,
            "read_file",
            {**A, "start_line": 1, "end_line": 1},
            "unchanged since turn 0: a.txt (lines 1-1) is as you read it then",
        ),
    ],
    "an-error-is-not-remembered": [
        (0, "read_file", {**A, "start_line": 5}, "error: start_line 5 is past the end..."),
        (1, "read_file", {**A, "start_line": 5}, "error: start_line 5 is past the end..."),
    ],
    "write-of-the-same-content": [
        (0, "write_file", {**A, "content": A_TEXT}, "unchanged: a.txt already holds this..."),
    ],
    "edit-to-the-same-text": [
        (0, "edit_file", {**A, "old": "world", "new": "world"}, "unchanged: `new` is the..."),
    ],
    "edit-to-the-same-text-not-found": [
        (0, "edit_file", {**A, "old": "moon", "new": "moon"}, "error: `old` must occur..."),
    ],
}


@pytest.mark.parametrize("steps", list(DUPLICATES.values()), ids=list(DUPLICATES))
def test_duplicate_calls(world: World, steps: list[Step]) -> None:
    box = Toolbox(Checkout.folder(world.root, Sandbox(mode="none")), command_timeout=10)
    mtime = (world.root / "a.txt").stat().st_mtime_ns
    for turn, tool, arguments, expected in steps:
        reply = box.call(tool, arguments, turn=turn)
        if expected.endswith("..."):
            assert reply.startswith(expected[:-3]), (turn, reply)
        else:
            assert reply == expected, turn
    if not any(expected.startswith(("wrote", "exit code")) for *_, expected in steps):
        assert (world.root / "a.txt").stat().st_mtime_ns == mtime  # nothing was written


def test_duplicate_reads_are_not_suppressed_with_a_zero_window(world: World) -> None:
    box = Toolbox(world.root, memo_window=0)
    assert box.call("read_file", A, turn=1) == A_TEXT
    assert box.call("read_file", A, turn=1) == A_TEXT
