"""Examples in the docs, run as they are written and compared with what they show.

A page's examples are read from its fenced blocks, in page order:

- a block whose first line is a comment naming a file (``# cheap.yaml``) is that file;
- an ``sh`` block is run by bash in the page's folder, ``merlin`` being this checkout's
  CLI; a job id in it (12 hex digits) stands for the newest job, as a reader would take
  it from ``merlin list``;
- a ``text`` block right after an ``sh`` block is what that block prints: its stderr,
  then its stdout, as a terminal shows them when the progress lines come first.

Shown and real output are compared after ``normalized``: what changes from run to run
(times, ids, commit hashes, durations, paths) is replaced by stand-ins.

After a change to what merlin prints, write a page's real output into it, then read the
diff::

    python -m tests.e2e.doc_examples docs/scripted-model.md
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.helpers import merlin, merlin_env

DOCS = Path(__file__).parents[2] / "docs"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\n", re.M | re.S)
FILE_HEADER = re.compile(r"# (?P<name>[\w.-]+\.(?:yaml|yml|toml|py|md))\n")
JOB_ID = re.compile(r"\b[0-9a-f]{12}\b")
MERLIN_FUNCTION = f'merlin() {{ "{sys.executable}" -m merlin_flow.cli "$@"; }}\n'
STAND_INS = (
    (r"^\d\d:\d\d:\d\d ", "HH:MM:SS "),
    (r"\b[0-9a-f]{12}\b", "JOB"),
    (r"committed [0-9a-f]{10}\b", "committed COMMIT"),
    (r" in \d+\.\d+s\b", " in N.NNs"),
    (r" in \d+\.\d+ s\b", " in N.N s"),
    (r" · \d+s · ", " · Ns · "),
    (r"(throwaway repository|patch): /\S+", r"\1: PATH"),
)


def normalized(text: str) -> list[str]:
    """Lines with what changes from run to run (times, ids, hashes, paths) replaced."""
    for pattern, stand_in in STAND_INS:
        text = re.sub(pattern, stand_in, text, flags=re.MULTILINE)
    return [line.rstrip() for line in text.splitlines()]


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, its text, and where it begins and ends."""

    lang: str
    body: str
    start: int
    end: int


@dataclass(frozen=True)
class Run:
    """An ``sh`` block that was run: its commands, what it printed, what the page shows."""

    commands: str
    output: str
    returncode: int
    shown: str | None


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page, in order."""
    return [
        Block(match["lang"], match["body"], match.start(), match.end())
        for match in FENCE.finditer(page)
    ]


def run_examples(page: str, folder: Path, env: dict[str, str]) -> list[Run]:
    """Write the page's files and run its ``sh`` blocks in ``folder``, in page order."""
    folder.mkdir(parents=True, exist_ok=True)
    found, runs = blocks(page), list[Run]()
    for index, block in enumerate(found):
        header = FILE_HEADER.match(block.body)
        if header is not None:
            (folder / header["name"]).write_text(block.body)
        if block.lang != "sh":
            continue
        after = found[index + 1] if index + 1 < len(found) else None
        shown = None
        if after is not None and after.lang == "text" and not page[block.end : after.start].strip():
            shown = after.body
        commands = block.body
        if JOB_ID.search(commands):
            commands = JOB_ID.sub(newest_job(env), commands)
        result = subprocess.run(
            ["bash", "-c", MERLIN_FUNCTION + commands],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        runs.append(Run(block.body, result.stderr + result.stdout, result.returncode, shown))
    return runs


def example_env(home: Path) -> dict[str, str]:
    """The environment examples run in: a new MERLIN_HOME; output as in a pipe, unwrapped."""
    env = merlin_env(home)
    env.pop("COLUMNS", None)  # rich's width in a pipe (the table a page shows)
    return env


def newest_job(env: dict[str, str]) -> str:
    """The id of the newest job in the environment's MERLIN_HOME."""
    listed = merlin(env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    assert jobs, "a command names a job, but there is none yet"
    return str(jobs[0]["id"])


def rewrite(path: Path) -> None:
    """Replace the output ``path`` shows with what its examples print now."""
    page = path.read_text()
    with tempfile.TemporaryDirectory() as scratch:
        runs = run_examples(page, Path(scratch) / "work", example_env(Path(scratch) / "home"))
    found = blocks(page)
    pieces, done = [], 0
    outputs = iter(runs)
    for index, block in enumerate(found):
        if block.lang != "sh":
            continue
        run = next(outputs)
        if run.shown is None:
            continue
        after = found[index + 1]
        body_start = page.index("\n", after.start) + 1
        shown = "".join(f"{line.rstrip()}\n" for line in run.output.rstrip().splitlines())
        pieces += [page[done:body_start], shown]
        done = after.end - len("```\n")
    path.write_text("".join([*pieces, page[done:]]))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        rewrite(Path(name))
