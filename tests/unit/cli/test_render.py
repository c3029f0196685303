"""The CLI's tables: steps, failure notes, costs, and how a cost is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from merlin_flow.cli.render import FAILURE_LINES, failure_notes, steps_table
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import AttemptStatus, Database
from tests.unit.scripted_jobs import scripted_job


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


def _text(renderable: Any, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_steps_table_shows_each_step_its_attempts_and_the_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    text = _text(steps_table(job_view(db, job_id)))
    assert f"job {job_id}" in text
    assert "running" in text
    s0 = next(line for line in text.splitlines() if "│ s0" in line)
    assert "✓" in s0
    assert "execute@local exit 0" in s0
    s1 = next(line for line in text.splitlines() if "│ s1" in line)
    assert "○" in s1
    assert "Pending" in s1


def test_every_attempt_status_has_its_mark_and_a_cancelled_one_says_so() -> None:
    cancelled = view("cancelled", None, "")
    console = Console(width=200, record=True)
    console.print(steps_table(cancelled))
    text = console.export_text()
    assert "fix@local cancelled" in text
    assert "?" not in text
    for status in AttemptStatus:
        console.print(steps_table(view(status, None, "")))  # a missing mark raises KeyError


def test_plain_steps_are_one_whole_line_per_step_however_long() -> None:
    long = view("failed", 1, "boom\n")
    long["steps"][0]["exit_command"] = "python -m pytest -q" + " tests/test_x.py" * 20
    console = Console(width=4096, soft_wrap=True, record=True)
    console.print(steps_table(long, plain=True))
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0] == "job job123 · t · failed · $0.0000"
    assert lines[1].startswith("  fix · Debug · Failed · tier local · - · fix@local exit 1 ✗ · ")
    assert lines[1].endswith("exit command: " + long["steps"][0]["exit_command"])
    assert not any("│" in line or "…" in line for line in lines)
    assert "merlin logs job123 --step fix" in text


def test_an_open_attempt_with_no_live_worker_reads_waiting_not_verifying() -> None:
    committed = view("committed", None, "")
    alive, stalled = Console(width=200, record=True), Console(width=200, record=True)
    alive.print(steps_table(committed))
    stalled.print(steps_table(committed, stalled=True))
    assert "fix@local verifying…" in alive.export_text()
    assert "fix@local waiting for a worker" in stalled.export_text()
    plain = steps_table(view("passed", 0, ""), plain=True, stalled=True)
    stalled.print(plain)
    assert "fix@local exit 0 ✓" in stalled.export_text()  # a closed attempt keeps its mark


def test_status_says_where_each_step_started_and_why(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.cli.render import route_lines

    job_id = scripted_job(db, settings, py_repo, tmp_path)
    shown = route_lines(job_view(db, job_id))
    assert shown.startswith("started on:\n")
    assert shown.splitlines()[1].startswith("  ")
    assert ": by the rules (0 similar steps in the journal, 3 needed to learn)" in shown
    assert route_lines({**job_view(db, job_id), "steps": []}) == ""  # type: ignore[typeddict-item]
