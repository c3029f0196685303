"""docs/agents.md, run as written: its files, its commands, the output it shows.

The page's examples are read from the page itself and run as a reader would, with
``tests.e2e.doc_examples``: an agent of your own (``merlin agents`` init, create, edit,
list and show) in a new git repository, and the worked example, a real job with a
scripted model, in a shop the page builds file by file. The shop's repository is
``/work/shop`` on the page. The refusals of the Permissions section are run in copies of
that shop. Every output the page shows must be what merlin prints.
"""

from __future__ import annotations

import re
import shutil
from itertools import pairwise
from pathlib import Path

import pytest

from tests.conftest import git
from tests.e2e.doc_examples import (
    DOCS,
    Run,
    blocks,
    console_commands,
    example_env,
    run_commands,
    run_examples,
    shows,
)

pytestmark = pytest.mark.e2e

PAGE = (DOCS / "agents.md").read_text()
SHOP = "/work/shop"
REFUSALS = (
    "### Rules",
    "### Precedence",
    "### What a repository's own merlin.toml may not do",
)


def _section(heading: str) -> str:
    """The page's text under ``heading``, up to the next heading as high (not in a block)."""
    level = heading.split(" ", 1)[0]
    text, fenced = [], False
    for line in PAGE.split(f"\n{heading}\n", 1)[1].splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        mark = line.split(" ", 1)[0]
        if not fenced and set(mark) == {"#"} and len(mark) <= len(level):
            break
        text.append(line)
    return "".join(text)


def _check(runs: list[Run], shop: Path, returncode: int = 0) -> list[Run]:
    """Each run ended with ``returncode`` and printed what the page shows; those shown."""
    for run in runs:
        assert run.returncode == returncode, f"$ {run.commands}\n{run.output}"
    checked = [run for run in runs if run.shown is not None]
    for run in checked:
        assert run.shown is not None
        real = run.output.replace(str(shop), SHOP)
        assert shows(real, run.shown), f"$ {run.commands}\n{real}"
    return checked


def test_an_agent_of_your_own_is_made_as_the_page_shows(tmp_path: Path) -> None:
    shop = tmp_path / "shop"
    shop.mkdir()
    git(shop, "init", "-q", "-b", "main")
    section = _section("### Example: an agent of your own")
    runs = run_examples(section, shop, example_env(tmp_path / "home"))

    checked = _check(runs, shop)
    assert [run.commands.split(" --")[0].split("merlin ")[1].strip() for run in checked] == [
        "agents init",
        "agents create db-migrator",
        "agents edit db-migrator",
        "agents list",
        "agents show db-migrator",
    ]
    # The editor made the agent's file what the page shows: the file block that follows.
    (edited,) = (
        block.body
        for block in blocks(section)
        if block.lang == "markdown" and "\nname: db-migrator\n" in block.body
    )
    assert (shop / ".merlin/agents/db-migrator.md").read_text() == edited


def test_the_worked_example_and_the_refusals_print_what_the_page_shows(tmp_path: Path) -> None:
    shop = tmp_path / "example" / "shop"
    env = example_env(tmp_path / "example" / "home")
    section = _section("## A worked example")
    runs = run_examples(section, shop, env)
    checked = _check(runs, shop)
    assert [run.commands.split(" ")[:2] for run in checked] == [
        ["merlin", "agents"],
        ["merlin", "run"],
        ["merlin", "status"],
        ["merlin", "logs"],
    ]

    # The tree the page draws is the shop its files make.
    tree = next(b.body for b in blocks(section) if b.lang == "text" and b.body.startswith("shop/"))
    paths = re.findall(r"^[├└]── (\S+)", tree, re.M)
    assert len(paths) == 9
    assert [path for path in paths if not (shop / path).is_file()] == []

    # "The commit and the patch hold only tests/test_discount.py" (uv.lock was undone).
    patch = Path(re.findall(r"^patch: (\S+)", checked[1].output, re.M)[0])
    assert re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M) == ["tests/test_discount.py"]

    # The transcript "How deny rules reach commands" quotes is the review's, in its logs.
    (quoted,) = (
        block.body
        for block in blocks(_section("## How deny rules reach commands"))
        if block.lang == "text" and block.body.startswith("→ run_command")
    )
    assert "…" in quoted  # abridged, as the page says
    assert shows(checked[3].output, quoted), quoted

    # What the page says `merlin agents run ... --dry-run` prints, it prints.
    said = re.search(r"`(merlin agents run [^`]+ --dry-run)` prints(.+?)(?:\n\n|$)", section, re.S)
    assert said is not None
    dry_run = run_commands(said[1], None, shop, env)
    assert dry_run.returncode == 0, dry_run.output
    quotes = [" ".join(quote.split()) for quote in re.findall(r"`([^`]+)`", said[2])]
    assert len(quotes) == 4
    printed = " ".join(dry_run.output.split())
    assert [quote for quote in quotes if quote not in printed] == []

    # The refusals, each in a copy of the shop, with a new MERLIN_HOME.
    for number, heading in enumerate(REFUSALS):
        copy = tmp_path / f"refusal-{number}" / "shop"
        shutil.copytree(shop, copy, symlinks=True)
        home = tmp_path / f"refusal-{number}" / "home"
        refused = _check(run_examples(_section(heading), copy, example_env(home)), copy, 2)
        assert [run.commands for run in refused] == ["merlin run tasklist.yaml\n"], heading


def test_every_output_the_page_shows_is_checked() -> None:
    """Each text block is a command's output the tests above check, the tree, or the quote."""
    found = blocks(PAGE)
    outputs = [block for block in found if block.lang == "text"]
    after_commands = [
        after
        for block, after in pairwise(found)
        if block.lang == "sh" and after.lang == "text" and not PAGE[block.end : after.start].strip()
    ]
    assert len(outputs) == len(after_commands) + 2  # the tree and the quoted transcript
    checked_sections = [
        "### Example: an agent of your own",
        "## A worked example",
        *REFUSALS,
    ]
    commands_in = "".join(_section(heading) for heading in checked_sections)
    for block in after_commands:
        assert block.body in commands_in
    consoles = [block for block in found if block.lang == "console"]
    assert len(consoles) == 3
    for block in consoles:
        assert block.body in commands_in
        assert all(shown for _command, shown in console_commands(block.body))
