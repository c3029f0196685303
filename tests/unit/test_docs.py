"""The docs stay true: every variable merlin reads is in the reference's table."""

from __future__ import annotations

import re
from pathlib import Path

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
