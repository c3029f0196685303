"""A benchmark's own section of docs/BENCHMARKS.md, replaced in place on each run."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, heading: str, text: str) -> None:
    """Replace the section of ``path`` under ``heading`` (up to the next ``## ``), or append it."""
    lines = path.read_text().splitlines(keepends=True)
    start = next((n for n, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        path.write_text("".join(lines).rstrip("\n") + f"\n\n{text}")
        return
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith("## ")), len(lines))
    after = "".join(lines[end:])
    path.write_text("".join(lines[:start]) + text + ("\n" + after if after else ""))
