"""What jobs cost, as `merlin costs` draws it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

from merlin_flow.cli.cost_tables import costs_since_table, job_costs_tables, money
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.costs import costs_since, job_costs
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.unit.scripted_jobs import scripted_job


def _text(renderable: Any, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_money_says_when_a_cost_is_unknown_or_only_a_floor() -> None:
    assert money({"unpriced_calls": 0, "known_cost_usd": 0.01234, "cost_usd": 0.01234}) == (
        "$0.0123"
    )
    assert money({"unpriced_calls": 3, "known_cost_usd": 0.0, "cost_usd": None}) == "unknown"
    assert money({"unpriced_calls": 1, "known_cost_usd": 0.5, "cost_usd": None}) == (
        "≥$0.5000 (+1 unpriced call)"
    )
    assert money({"unpriced_calls": 2, "known_cost_usd": 0.5, "cost_usd": None}).endswith(
        "(+2 unpriced calls)"
    )


def test_the_cost_tables_of_a_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    report = job_costs(db, job_id)
    text = "\n".join(_text(table) for table in job_costs_tables(report))
    assert "per tier" in text
    assert f"{report['total']['calls']}" in text
    local = [line for line in text.splitlines() if "│ local" in line]
    assert local
    assert all("$0.0000" in line for line in local)
    since = _text(costs_since_table(costs_since(db, timedelta(days=1))))
    assert "local" in since


def _row(tier: str, calls: int, tokens: int, cost: float) -> dict[str, Any]:
    return {
        "tier": tier, "calls": calls, "replayed_calls": 0, "cached_calls": calls // 2,
        "failed_calls": 1, "prompt_tokens": tokens, "completion_tokens": tokens // 10,
        "cost_usd": cost, "known_cost_usd": cost, "unpriced_calls": 0,
    }  # fmt: skip


def test_the_numbers_are_right_aligned_so_their_digits_line_up() -> None:
    rows = [_row("local", 7, 5, 0.5), _row("premium", 1234, 120_000, 12.25)]
    report: Any = {
        "jobs": 2, "since": "2026-11-01T00:00:00Z", "escalations": 1, "tiers": rows,
        "total": _row("total", 1241, 120_005, 12.75),
    }  # fmt: skip
    lines = _text(costs_since_table(report)).splitlines()
    body = [line for line in lines if line.startswith("│ ")]
    assert [line.split("│")[1].strip() for line in body] == ["local", "premium", "total"]
    for line in body:
        numeric = line.split("│")[2:-1]  # the cells after the tier's
        assert len(numeric) == 7
        for cell in numeric:  # a right-aligned cell has one space of padding after its text
            assert cell.endswith(" "), line
            assert not cell.endswith("  "), line
    # so each column's last digits are in one place on every row
    ends = {line.index("$") + len(line.split("$")[1].split(" ")[0]) for line in body}
    assert len(ends) == 1, body
