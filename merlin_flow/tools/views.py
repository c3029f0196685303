"""How the file tools show a file's text: numbered line ranges, and help for a failed edit.

A failed ``edit_file`` is answered with what the model needs to retry at once: the
passages most like its ``old`` (difflib, over windows of as many lines as ``old`` has),
or the lines where an ``old`` that occurs several times starts. Finding the closest
passages is quick on long files too: every window is first scored by the share of
``old``'s words it holds (one pass, sliding), and only the best few are compared
character by character.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter

CLOSEST_CANDIDATES = 3
"""How many passages a failed edit shows as the closest to ``old``."""
CLOSEST_CUTOFF = 0.5
"""How alike (difflib ratio, 0 to 1) a passage must be to ``old`` to be shown."""
COMPARED_WINDOWS = 40
"""How many windows, the best by shared words, are compared character by character."""
_WORD = re.compile(r"\w+")


def line_number(value: object, name: str) -> int | None:
    """A line number argument: a whole number from 1 (digits in a string accepted).

    ValueError when it is anything else; None stays None.
    """
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number")
    if value < 1:
        raise ValueError(f"{name} must be 1 or more: lines are numbered from 1")
    return value


class RangeError(Exception):
    """A line range outside the file (the tool answers with it as an error)."""


def numbered_range(rel: str, lines: list[str], first: int, last: int | None, limit: int) -> str:
    """Lines ``first`` to ``last`` of a file, numbered, under a header with its line count.

    As many lines as fit ``limit`` characters are shown (one at least, cut if it alone is
    longer), and the header says where to read on.
    """
    total = len(lines)
    if first > total:
        raise RangeError(f"start_line {first} is past the end: {rel} has {total} lines")
    if last is not None and last < first:
        raise RangeError(f"end_line {last} is before start_line {first}")
    end = total if last is None else min(last, total)
    note = f" (end_line {last} is past the end)" if last is not None and last > total else ""
    width, used, shown = len(str(end)) + 1, 0, first - 1
    while shown < end and (shown < first or used + width + len(lines[shown]) + 1 <= limit):
        used += width + len(lines[shown]) + 1
        shown += 1
    body = numbered(lines[first - 1 : shown], first)
    if len(body) > limit:  # one line longer than the limit
        body = body[:limit] + f"\n[line {first} cut at {limit} characters]"
    if shown < end:
        note += f"; the rest does not fit one read: read on with start_line {shown + 1}"
    return f"{rel}: lines {first}-{shown} of {total}{note}\n{body}"


def numbered(lines: list[str], first: int) -> str:
    """``lines`` numbered from ``first``, ``cat -n`` style (right-aligned number, tab)."""
    width = len(str(first + len(lines) - 1))
    return "\n".join(f"{n:>{width}}\t{line}" for n, line in enumerate(lines, first))


def closest(lines: list[str], old: str) -> str:
    """The passages of ``lines`` most like ``old``, numbered, best first; or a hint."""
    size = max(1, len(old.splitlines()))
    starts = _best_by_words(lines, old, size)
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(old.rstrip("\n"))
    scored = []
    for start in starts:
        matcher.set_seq1("\n".join(lines[start : start + size]))
        if (
            matcher.real_quick_ratio() >= CLOSEST_CUTOFF
            and matcher.quick_ratio() >= CLOSEST_CUTOFF
            and (ratio := matcher.ratio()) >= CLOSEST_CUTOFF
        ):
            scored.append((ratio, start))
    chosen: list[tuple[float, int]] = []
    for ratio, start in sorted(scored, key=lambda item: (-item[0], item[1])):
        if all(abs(start - other) >= size for _, other in chosen):  # no overlapping passages
            chosen.append((ratio, start))
        if len(chosen) == CLOSEST_CANDIDATES:
            break
    if not chosen:
        return "nothing in the file is close to it: read the file again and copy `old` exactly"
    shown = [
        f"lines {start + 1}-{min(start + size, len(lines))} ({ratio:.0%} alike):\n"
        + numbered(lines[start : start + size], start + 1)
        for ratio, start in chosen
    ]
    return "the closest lines (their numbers are not part of the file):\n" + "\n".join(shown)


def occurrences(text: str, old: str) -> str:
    """The line numbers where ``old`` starts in ``text``, as ``3, 9 and 14``."""
    numbers, index = [], text.find(old)
    while index != -1:
        numbers.append(str(text.count("\n", 0, index) + 1))
        index = text.find(old, index + len(old))
    return numbers[0] if len(numbers) == 1 else f"{', '.join(numbers[:-1])} and {numbers[-1]}"


def _best_by_words(lines: list[str], old: str, size: int) -> list[int]:
    """The starts of the COMPARED_WINDOWS windows holding most of ``old``'s words."""
    windows = range(max(1, len(lines) - size + 1))
    wanted = set(_WORD.findall(old))
    if not wanted:  # punctuation only: short, so every window is cheap to compare
        return list(windows)
    words = [set(_WORD.findall(line)) & wanted for line in lines]
    held: Counter[str] = Counter()
    present = 0  # how many of the wanted words the window holds

    def move(line: set[str], step: int) -> None:
        nonlocal present
        for word in line:
            held[word] += step
            present += (step > 0 and held[word] == 1) - (step < 0 and held[word] == 0)

    for line in words[:size]:
        move(line, 1)
    scores = []
    for start in windows:
        if start:  # slide the window one line down
            move(words[start - 1], -1)
            if start + size - 1 < len(lines):
                move(words[start + size - 1], 1)
        scores.append((present, start))
    best = sorted(scores, key=lambda item: (-item[0], item[1]))[:COMPARED_WINDOWS]
    return [start for _, start in best]
