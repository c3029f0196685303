"""docs/scripted-model.md, run as written: its files, its commands, the output it shows.

The page's examples (the worked example, the planner, the question) are read from the
page itself and run in one folder, in page order, as a reader would
(``tests.e2e.doc_examples``); the output each shows must be what merlin prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.doc_examples import (
    DOCS,
    blocks,
    example_env,
    normalized,
    run_examples,
)
from tests.e2e.helpers import merlin

pytestmark = pytest.mark.e2e

PAGE = (DOCS / "scripted-model.md").read_text()
EXAMPLE_SECTIONS = ("## A worked example", "## Scripting the planner", "## Scripting a question")


def _section(heading: str) -> str:
    """The text of the page's section under ``heading``, up to the next section."""
    return PAGE.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_every_example_of_the_page_prints_what_it_shows(tmp_path: Path) -> None:
    env = example_env(tmp_path / "home")
    runs = run_examples(PAGE, tmp_path / "work", env)
    for run in runs:
        assert run.returncode == 0, f"$ {run.commands}\n{run.output}"
    checked = [run for run in runs if run.shown is not None]
    for heading in EXAMPLE_SECTIONS:  # each example shows output that is checked
        section = _section(heading)
        assert any(run.commands in section for run in checked), heading
    for run in checked:
        assert run.shown is not None
        assert normalized(run.output) == normalized(run.shown), f"$ {run.commands}"

    # The step's prompt the page quotes is the worked example's, as its agent got it.
    (quoted,) = (
        block.body
        for block in blocks(_section("## What the conversation contains"))
        if block.lang == "text" and block.body.startswith("Step ")
    )
    jobs = json.loads(merlin(env, "list", "--json").stdout)
    prompts = []
    for job in jobs:
        entries = json.loads(merlin(env, "logs", job["id"], "--json").stdout)
        prompts += [e["transcript"][0]["content"] for e in entries if e["number"] == 1]
    assert quoted.rstrip("\n") in prompts
    # No other output on the page: every text block is one of those checked here.
    assert len([block for block in blocks(PAGE) if block.lang == "text"]) == len(checked) + 1
