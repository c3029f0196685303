"""The docs stay true: every variable merlin reads is in the reference's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from merlin_flow.settings import Settings

ROOT = Path(__file__).parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()
TABLE = REFERENCE.split("## Environment variables", 1)[1].split("\n## ", 1)[0]


def test_every_setting_is_in_the_environment_variable_table() -> None:
    names = [f"MERLIN_{field.upper()}" for field in Settings.model_fields]
    assert names  # the settings are found
    assert [name for name in names if f"`{name}`" not in TABLE] == []


def test_every_variable_the_code_and_the_test_servers_read_is_in_the_table() -> None:
    sources = [*ROOT.glob("merlin_flow/**/*.py"), *ROOT.glob("workers/*.py")]
    sources += [*ROOT.glob("tests/*.py")]
    found = {
        name
        for path in sources
        for name in re.findall(r"\bMERLIN_[A-Z_]*[A-Z]\b", path.read_text())
        if not name.startswith("MERLIN_PR_")  # the GitHub workflow's secret (security.md)
    }
    assert "MERLIN_TEST_REDIS_URL" in found
    assert sorted(name for name in found if f"`{name}`" not in TABLE) == []


def test_every_event_kind_is_in_the_reference() -> None:
    from merlin_flow.store.events import EventKind

    kinds = REFERENCE.split("Event kinds", 1)[1].split("\n\n", 1)[0]
    assert "`job_finished`" in kinds  # the list is read
    assert [kind.value for kind in EventKind if f"`{kind.value}`" not in kinds] == []


def test_the_readme_lists_every_user_page_of_the_docs() -> None:
    listed = (ROOT / "README.md").read_text().split("## Documentation", 1)[1].split("\n## ")[0]
    for_contributors = {"architecture.md", "BENCHMARKS.md", "RELIABILITY.md"}  # CONTRIBUTING's
    pages = {page.name for page in (ROOT / "docs").glob("*.md")} - for_contributors
    assert "models.md" in pages
    assert sorted(page for page in pages if f"](docs/{page})" not in listed) == []


def test_the_schema_error_operations_shows_is_the_one_merlin_prints() -> None:
    from merlin_flow.store.database import head_revision

    operations = (ROOT / "docs" / "operations.md").read_text()
    printed = f"error: database schema is at nothing, not at {head_revision()}: run `merlin db"
    assert printed in operations


def test_the_reference_command_list_is_what_the_help_says() -> None:
    import typer.main

    from merlin_flow.cli.app import app

    group = typer.main.get_command(app)
    assert hasattr(group, "commands")  # typer's group: click's, or typer's own copy
    block = REFERENCE.split("## Command line", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    rows = [re.match(r"  (\S+)( \S+)?\s{2,}(.*)", line) for line in block.splitlines()[1:]]
    listed = {row.group(1): (row.group(2), row.group(3)) for row in rows if row}
    assert len(listed) == len(rows)  # every row is read
    assert sorted(listed) == sorted(group.commands)  # every command, and only those
    for name, (sub, text) in listed.items():
        command = group.commands[name]
        if hasattr(command, "commands"):  # `specs list|show`: its subcommands
            assert sub is not None, name
            assert sub.strip().split("|") == list(command.commands), name
        else:
            said = " ".join((command.help or "").split("\n\n")[0].split())
            assert (name, text) == (name, said)


def test_the_quickstart_shows_the_error_of_a_mistyped_tasklist(
    merlin_home: Path, py_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from merlin_flow.cli.app import app

    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    tasklist = re.search(r"```yaml\n# tasklist.yaml\n(.*?)```", quickstart, re.S)
    shown = re.search(
        r"```text\n(error: tasklist.yaml: invalid TaskList\n.*?)```", quickstart, re.S
    )
    assert tasklist is not None
    assert shown is not None
    mistyped = tasklist.group(1).replace("step_type: Debug", "step_type: Bugfix", 1)
    assert mistyped != tasklist.group(1)
    (tmp_path / "tasklist.yaml").write_text(mistyped)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["submit", "tasklist.yaml", "--repo", str(py_repo)])
    assert result.exit_code == 2
    assert result.stderr == shown.group(1)
