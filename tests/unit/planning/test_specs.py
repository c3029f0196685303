"""Specs: read from a commit, scored against a request, their constraint sections; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.planning.specs import Spec, TokenOverlap, load_specs, ranked, relevant, words
from tests.conftest import git, make_repo

AUTH = """\
# Authentication

## Purpose
Log users in with a password or a token.

## Invariants
- A session token expires after 30 minutes.
- Passwords are never logged.

## Notes
Long history of the login module.

## Error Cases
A wrong password returns 401, never 500.
"""
BILLING = "# Billing\n\n## Purpose\nInvoices and payments for each customer account.\n"
SEARCH = "# Search\n\nRanking of documents by query; the token index lives in search/.\n"


@pytest.fixture
def spec_repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {
            "specs/auth.md": AUTH,
            "specs/billing.md": BILLING,
            "specs/more/search.md": SEARCH,
            "specs/notes.txt": "not a spec",
            "docs/other.md": "# Other\n",
        },
    )


def test_specs_are_the_markdown_files_under_the_paths_at_the_commit(spec_repo: Path) -> None:
    (spec_repo / "specs" / "draft.md").write_text("# Draft, not committed\n")
    specs = load_specs(spec_repo, git(spec_repo, "rev-parse", "HEAD"), ["specs"])
    assert [(s.path, s.title) for s in specs] == [
        ("specs/auth.md", "Authentication"),
        ("specs/billing.md", "Billing"),
        ("specs/more/search.md", "Search"),
    ]


def test_constraints_are_the_named_sections_only() -> None:
    constraints = Spec("specs/auth.md", "Authentication", AUTH).constraints()
    assert list(constraints) == ["Purpose", "Invariants", "Error Cases"]
    assert constraints["Invariants"].startswith("- A session token expires after 30 minutes.")
    assert "Long history" not in "".join(constraints.values())


def test_words_drop_short_words_stop_words_and_case() -> None:
    assert words("The Session token MUST expire; it is 30 s.") == {"session", "token", "expire"}


def test_a_word_few_specs_have_counts_more_than_one_many_have() -> None:
    specs = [Spec("a.md", "A", AUTH), Spec("b.md", "B", BILLING), Spec("c.md", "C", SEARCH)]
    scores = TokenOverlap().score("fix the session token expiry in login", specs)
    # auth has "session", "token", "login"; search has "token" too: token counts 1/2 each.
    assert scores == [pytest.approx(1 + 0.5 + 1), 0.0, pytest.approx(0.5)]
    assert [s.path for s, _ in ranked("session token", specs)] == ["a.md", "c.md", "b.md"]
    assert [s.path for s in relevant("session token", specs, top=3)] == ["a.md", "c.md"]
    assert relevant("unrelated words entirely", specs, top=3) == []


def test_merlin_specs_list_and_show(
    spec_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    listed = runner.invoke(
        app, ["specs", "list", "--for", "invoices for a customer", "--repo", str(spec_repo),
              "--json"],
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["path"], r["chosen"]) for r in rows][:2] == [
        ("specs/billing.md", True),
        ("specs/auth.md", False),
    ]
    assert rows[1]["constraints"] == ["Error Cases", "Invariants", "Purpose"]
    shown = runner.invoke(app, ["specs", "show", "specs/auth.md", "--repo", str(spec_repo)])
    assert shown.exit_code == 0, shown.output
    assert "## Invariants\n- A session token expires" in shown.stdout
    assert "Long history" not in shown.stdout
    missing = runner.invoke(app, ["specs", "show", "specs/nope.md", "--repo", str(spec_repo)])
    assert missing.exit_code == 2
    assert "no spec 'specs/nope.md'; the specs: specs/auth.md" in missing.output
