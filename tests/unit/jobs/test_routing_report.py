"""`merlin costs --routing`: how often the first tier was right, and what misroutes cost."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.jobs.routing_report import routing_report
from merlin_flow.store import Database
from tests.unit.journal_rows import add_finished_step

JOURNAL = {"by": "journal", "tier": "local"}
RULES = {"by": "rules", "tier": "fast"}


def journal_of_four(db: Database) -> None:
    add_finished_step(db, "/r", "a", [("local", "passed", 0.01)], JOURNAL)
    add_finished_step(
        db, "/r", "b", [("local", "failed", 0.01), ("local", "passed", 0.02)], JOURNAL
    )
    add_finished_step(db, "/r", "c", [("local", "failed", 0.01), ("fast", "passed", 0.1)], JOURNAL)
    add_finished_step(db, "/s", "d", [("fast", "failed", 0.1), ("premium", "failed", 1.0)], RULES)
    add_finished_step(db, "/s", "e", [("fast", "passed", 0.1)])  # before steps.route


def test_steps_are_counted_by_how_they_were_routed_and_where_they_started(db: Database) -> None:
    journal_of_four(db)
    report = routing_report(db)
    rows = {(row["by"], row["tier"]): row for row in report["rows"]}
    assert set(rows) == {("journal", "local"), ("rules", "fast"), ("unrecorded", "fast")}
    local = rows["journal", "local"]
    assert (local["steps"], local["right_first"], local["escalated"], local["failed"]) == (
        3,
        2,
        1,
        0,
    )
    assert local["right_share"] == pytest.approx(2 / 3)
    assert local["cost_usd"] == pytest.approx(0.15)
    assert local["wasted_usd"] == pytest.approx(0.01)  # step c's local attempt
    rules = rows["rules", "fast"]
    assert (rules["failed"], rules["right_share"], rules["wasted_usd"]) == (1, 0.0, 1.1)
    total = report["total"]
    assert (total["steps"], total["right_first"]) == (5, 3)
    only_r = routing_report(db, repo="/r")
    assert only_r["total"]["steps"] == 3
    assert routing_report(db, since=timedelta(hours=1))["total"]["steps"] == 5


def test_the_cli_prints_the_table_and_the_json(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.cli.app import app

    journal_of_four(db)
    monkeypatch.setenv("MERLIN_DATABASE_URL", f"sqlite:///{tmp_path / 'merlin.db'}")
    runner = CliRunner()
    shown = runner.invoke(app, ["costs", "--routing"], terminal_width=160)
    assert shown.exit_code == 0, shown.output
    assert "5 finished steps · the first tier was right for 60%" in shown.output
    assert "journal" in shown.output
    as_json = runner.invoke(app, ["costs", "--routing", "--since", "1d", "--json"])
    assert json.loads(as_json.output)["total"]["right_first"] == 3
    refused = runner.invoke(app, ["costs", "JOB", "--routing"])
    assert refused.exit_code == 2
    assert "--routing reports on every job" in refused.output
