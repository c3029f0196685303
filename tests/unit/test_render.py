"""The notes under the steps table: a failed exit command's last lines and where the rest is."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from merlin_flow.cli.render import FAILURE_LINES, failure_notes, steps_table


def view(status: str, exit_code: int | None, output: str) -> dict[str, Any]:
    attempt = {
        "number": 2,
        "kind": "fix",
        "tier": "local",
        "status": status,
        "exit_code": exit_code,
        "output_tail": output,
    }
    step = {
        "id": "fix",
        "step_type": "Debug",
        "status": "Failed",
        "tier": "local",
        "attempts": [attempt],
        "exit_command": "python -m pytest -q",
    }
    return {"id": "job123", "title": "t", "status": "failed", "cost_usd": 0.0, "steps": [step]}


def test_a_failed_exit_command_shows_its_last_lines_and_names_merlin_logs() -> None:
    output = "\n".join(f"line {n}" for n in range(30)) + "\n"
    notes = failure_notes(view("failed", 1, output)).plain
    assert "`python -m pytest -q` exited with code 1 (attempt 2, tier local)" in notes
    assert f"line {29}" in notes
    assert f"line {29 - FAILURE_LINES}" not in notes
    assert "merlin logs job123 --step fix" in notes
    console = Console(width=200, record=True)
    console.print(steps_table(view("failed", 1, output)))
    assert "merlin logs job123 --step fix" in console.export_text()


def test_no_notes_for_a_passed_or_an_agent_error_attempt() -> None:
    assert failure_notes(view("passed", 0, "ok")).plain == ""
    assert failure_notes(view("error", None, "")).plain == ""
