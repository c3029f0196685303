"""Examples in the docs, run as they are written and compared with what they show.

A page's examples are read from its fenced blocks, in page order:

- a block whose first line is a comment naming a file (``# cheap.yaml``,
  ``# .merlin/agents/shared/checklist.md``, ``<!-- notes.md -->``; in an agent file, the
  first line of its front matter: ``---`` then ``# .merlin/agents/reviewer.md``) is that
  file, relative to the page's folder; ``$MERLIN_HOME/`` starts one in MERLIN_HOME;
- an ``sh`` block is run by bash in the page's folder, ``merlin`` being this checkout's
  CLI; a job id in it (12 hex digits) stands for the newest job, as a reader would take
  it from ``merlin list``;
- a ``text`` block right after an ``sh`` block is what that block prints: its stderr,
  then its stdout, as a terminal shows them when the progress lines come first;
- a ``console`` block is commands (``$ `` lines), each followed by what it prints, run
  one by one as an ``sh`` block is;
- ``nano``, the editor of an example (``EDITOR=nano merlin agents edit NAME``), is a
  stand-in that makes the file it edits what the page shows of it (its file block).

Shown and real output are compared after ``normalized``: what changes from run to run
(times, ids, commit hashes, durations, paths) is replaced by stand-ins. Output shown
abridged, with ``…`` for what is left out, is compared by ``shows``.

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
FILE_NAME = r"(?:\$MERLIN_HOME/)?[\w.-]+(?:/[\w.-]+)*\.(?:yaml|yml|toml|py|md)"
FILE_HEADER = re.compile(rf"(?:---\n)?(?:# (?P<name>{FILE_NAME})|<!-- (?P<html>{FILE_NAME}) -->)\n")
ELISION = "…"
PROMPT = "$ "
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


def quickstart_demo_mismatches(out: str) -> list[list[str]]:
    """The two outputs of ``merlin demo`` docs/quickstart.md shows (its progress and its
    summary, normalized) that ``out`` does not hold as shown; [] when both are there."""
    quickstart = (DOCS / "quickstart.md").read_text()
    samples = re.findall(
        r"```text\n(throwaway repository.*?|job [0-9a-f]{12} · .*?)```", quickstart, re.S
    )
    assert len(samples) == 2, "docs/quickstart.md shows the demo's progress and summary"
    lines = normalized(out)
    missing = []
    for sample in samples:
        expected = normalized(sample)
        start = lines.index(expected[0]) if expected[0] in lines else -1
        if start < 0 or lines[start : start + len(expected)] != expected:
            missing.append(expected)
    return missing


def shows(real: str, shown: str) -> bool:
    """Whether ``shown`` is ``real`` (both normalized), or, abridged, a part of it.

    Output is abridged when a line of it holds ``…``: then each shown line must be a line
    of the real output, in order, ``…`` standing for any text (or a whole line for any
    number of lines), and the spaces of a line counting as one.
    """
    real_lines, shown_lines = normalized(real), normalized(shown)
    if not any(ELISION in line for line in shown_lines):
        return real_lines == shown_lines
    remaining = iter(real_lines)
    for line in shown_lines:
        if line.strip() == ELISION:
            continue
        pattern = ".*".join(re.escape(" ".join(piece.split())) for piece in line.split(ELISION))
        pattern = pattern.replace(r"\ ", " ")
        if not any(re.fullmatch(pattern, " ".join(real_line.split())) for real_line in remaining):
            return False
    return True


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


def console_commands(body: str) -> list[tuple[str, str]]:
    """The commands of a ``console`` block, each with the output shown after it."""
    commands = list[tuple[str, str]]()
    for line in body.splitlines(keepends=True):
        if line.startswith(PROMPT):
            commands.append((line[len(PROMPT) :], ""))
        elif commands:
            command, shown = commands[-1]
            commands[-1] = (command, shown + line)
    return commands


def file_path(header: re.Match[str], folder: Path, env: dict[str, str]) -> Path:
    """Where a file block's file goes: in ``folder``, or in MERLIN_HOME."""
    name = header["name"] or header["html"]
    if name.startswith("$MERLIN_HOME/"):
        return Path(env["MERLIN_HOME"]) / name.removeprefix("$MERLIN_HOME/")
    return folder / name


def editor_env(page: str, folder: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with a ``nano`` that makes the file it opens what the page shows of it."""
    editor = folder.with_name(f"{folder.name}.editor")
    (editor / "bin").mkdir(parents=True, exist_ok=True)
    for block in blocks(page):
        header = FILE_HEADER.match(block.body)
        if header is not None:
            shown = editor / "files" / file_path(header, folder, env).resolve().relative_to("/")
            shown.parent.mkdir(parents=True, exist_ok=True)
            shown.write_text(block.body)
    nano = editor / "bin" / "nano"
    nano.write_text(f'#!/bin/sh\nexec cp "{editor / "files"}$(realpath "$1")" "$1"\n')
    nano.chmod(0o755)
    return {**env, "PATH": f"{editor / 'bin'}:{env['PATH']}"}


def run_examples(page: str, folder: Path, env: dict[str, str]) -> list[Run]:
    """Write the page's files and run its commands in ``folder``, in page order."""
    folder.mkdir(parents=True, exist_ok=True)
    found, runs = blocks(page), list[Run]()
    with_editor = editor_env(page, folder, env)
    for index, block in enumerate(found):
        header = FILE_HEADER.match(block.body)
        if header is not None:
            path = file_path(header, folder, env)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
        if block.lang == "console":
            for command, printed in console_commands(block.body):
                runs.append(run_commands(command, printed, folder, with_editor))
        if block.lang != "sh":
            continue
        after = found[index + 1] if index + 1 < len(found) else None
        shown: str | None = None
        if after is not None and after.lang == "text" and not page[block.end : after.start].strip():
            shown = after.body
        runs.append(run_commands(block.body, shown, folder, with_editor))
    return runs


def run_commands(commands: str, shown: str | None, folder: Path, env: dict[str, str]) -> Run:
    """Run ``commands`` as an example's: bash in ``folder``, ``merlin`` this checkout's."""
    run = commands
    if JOB_ID.search(run):
        run = JOB_ID.sub(newest_job(env), run)
    result = subprocess.run(
        ["bash", "-c", MERLIN_FUNCTION + run],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return Run(commands, result.stderr + result.stdout, result.returncode, shown)


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
        if block.lang == "console":
            body_start = page.index("\n", block.start) + 1
            body = ""
            for command, shown in console_commands(block.body):
                output = lines(next(outputs))
                body += PROMPT + command + (shown if abridged(shown) else output)
            pieces += [page[done:body_start], body]
            done = block.end - len("```\n")
        if block.lang != "sh":
            continue
        run = next(outputs)
        if run.shown is None or abridged(run.shown):
            continue
        after = found[index + 1]
        body_start = page.index("\n", after.start) + 1
        pieces += [page[done:body_start], lines(run)]
        done = after.end - len("```\n")
    path.write_text("".join([*pieces, page[done:]]))


def abridged(shown: str) -> bool:
    """Whether output is shown abridged (``…`` for what is left out): not rewritten."""
    return ELISION in shown


def lines(run: Run) -> str:
    """What ``run`` printed, as a page shows it."""
    return "".join(f"{line.rstrip()}\n" for line in run.output.rstrip().splitlines())


if __name__ == "__main__":
    for name in sys.argv[1:]:
        rewrite(Path(name))
