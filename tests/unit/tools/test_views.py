"""How the file tools show text: numbered ranges, the closest passages of a failed edit."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.unit.tools.conftest import World

# --- read_file line ranges -----------------------------------------------------------------

TEN = "".join(f"line {n}\n" for n in range(1, 11))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            {"start_line": 3, "end_line": 5},
            "f.txt: lines 3-5 of 10\n3\tline 3\n4\tline 4\n5\tline 5",
        ),
        ({"start_line": 9}, "f.txt: lines 9-10 of 10\n 9\tline 9\n10\tline 10"),
        ({"end_line": 2}, "f.txt: lines 1-2 of 10\n1\tline 1\n2\tline 2"),
        ({"start_line": 4, "end_line": 4}, "f.txt: lines 4-4 of 10\n4\tline 4"),
        (
            {"start_line": 10, "end_line": 40},
            "f.txt: lines 10-10 of 10 (end_line 40 is past the end)\n10\tline 10",
        ),
        ({"start_line": "2", "end_line": 2.0}, "f.txt: lines 2-2 of 10\n2\tline 2"),
    ],
    ids=["middle", "to-the-end", "from-the-start", "one-line", "end-past-the-end", "lenient"],
)
def test_read_file_range(world: World, args: dict[str, Any], expected: str) -> None:
    (world.root / "f.txt").write_text(TEN)
    assert world.box.call("read_file", {"path": "f.txt", **args}) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"start_line": 11}, "error: start_line 11 is past the end: f.txt has 10 lines"),
        ({"start_line": 5, "end_line": 3}, "error: end_line 3 is before start_line 5"),
        ({"start_line": 0}, "error: bad arguments for read_file: start_line must be 1 or more"),
        ({"end_line": -2}, "error: bad arguments for read_file: end_line must be 1 or more"),
        ({"start_line": "two"}, "error: bad arguments for read_file: start_line must be a whole"),
        ({"start_line": True}, "error: bad arguments for read_file: start_line must be a whole"),
        ({"start_line": 1.5}, "error: bad arguments for read_file: start_line must be a whole"),
    ],
    ids=["start-past-the-end", "reversed", "zero", "negative", "word", "bool", "fraction"],
)
def test_read_file_range_out_of_bounds(world: World, args: dict[str, Any], expected: str) -> None:
    (world.root / "f.txt").write_text(TEN)
    assert world.box.call("read_file", {"path": "f.txt", **args}).startswith(expected)


def test_read_file_range_of_an_empty_file(world: World) -> None:
    (world.root / "empty.txt").write_text("")
    reply = world.box.call("read_file", {"path": "empty.txt", "start_line": 1})
    assert reply == "error: start_line 1 is past the end: empty.txt has 0 lines"
    assert world.box.call("read_file", {"path": "empty.txt"}) == ""


def test_read_file_truncation_says_how_to_read_on(world: World) -> None:
    (world.root / "big.txt").write_text(("y" * 99 + "\n") * 2000)
    reply = world.box.call("read_file", {"path": "big.txt"})
    assert reply.splitlines()[0] == (
        "big.txt: lines 1-952 of 2000; the rest does not fit one read: read on with start_line 953"
    )
    part = world.box.call("read_file", {"path": "big.txt", "start_line": 1500, "end_line": 1501})
    assert part.splitlines()[0] == "big.txt: lines 1500-1501 of 2000"


# --- edit_file failures that help the retry ------------------------------------------------

CODE = """\
def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


def volume(width, height, depth):
    return width * height * depth
"""


def test_edit_not_found_shows_the_closest_lines(world: World) -> None:
    (world.root / "shapes.py").write_text(CODE)
    old = "def perimeter(width, height):\n  return 2 * (width + height)\n"  # 2-space indent
    reply = world.box.call("edit_file", {"path": "shapes.py", "old": old, "new": "x"})
    assert reply.startswith("error: `old` must occur exactly once in 'shapes.py'; not found")
    assert "lines 5-6 (" in reply
    assert "5\tdef perimeter(width, height):\n6\t    return 2 * (width + height)" in reply
    # The best candidate comes first, and at most three are shown.
    assert reply.index("lines 5-6") < reply.index("lines 1-2")
    assert reply.count(" alike):") <= 3
    assert (world.root / "shapes.py").read_text() == CODE


def test_edit_not_found_one_line(world: World) -> None:
    (world.root / "shapes.py").write_text(CODE)
    reply = world.box.call(
        "edit_file", {"path": "shapes.py", "old": "    return width * heigth * depth", "new": "x"}
    )
    assert "lines 10-10 (" in reply
    assert "10\t    return width * height * depth" in reply


def test_edit_not_found_and_nothing_close(world: World) -> None:
    (world.root / "shapes.py").write_text(CODE)
    reply = world.box.call(
        "edit_file", {"path": "shapes.py", "old": "class Zebra(Animal): ...", "new": "x"}
    )
    assert reply.endswith(
        "nothing in the file is close to it: read the file again and copy `old` exactly"
    )


def test_edit_found_several_times_names_the_lines(world: World) -> None:
    (world.root / "shapes.py").write_text(CODE)
    reply = world.box.call("edit_file", {"path": "shapes.py", "old": "(width, height", "new": "x"})
    assert "found 3 times, at lines 1, 5 and 9" in reply
    reply = world.box.call("edit_file", {"path": "shapes.py", "old": "width * height", "new": "x"})
    assert "found 2 times, at lines 2 and 10" in reply
    assert (world.root / "shapes.py").read_text() == CODE


def test_edit_closest_lines_on_a_long_file_is_quick(world: World) -> None:
    lines = [f"    value_{n} = compute(value_{n - 1}, {n})" for n in range(20_000)]
    (world.root / "long.py").write_text("\n".join(lines) + "\n")
    old = (
        "    value_12345 = compute(value_12344, 12345)\n"
        "    value_12346 = compute(value_1345, 12346)"  # a digit missing
    )
    started = time.monotonic()
    reply = world.box.call("edit_file", {"path": "long.py", "old": old, "new": "x"})
    assert time.monotonic() - started < 3  # about 0.1 s
    assert "lines 12346-12347 (" in reply
