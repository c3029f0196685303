"""Why a job failed, where users look: the failing exit command even when later attempts
changed nothing (the job's error, `--json`'s `failure`, the notes, JUnit, the summary)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console

from merlin_flow.cli.render import failure_notes
from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.costs import job_costs
from merlin_flow.jobs.reports import junit_xml
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.tool_config import Environment

TRIES = """\
rules:
  - match: 'Your earlier changes'  # the fix attempt: it gives up
    reply: {content: I cannot see what is wrong.}
  - match: 'solve the step afresh'  # the escalation: it gives up too
    reply: {content: Nothing to change.}
  - turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: notes.txt, content: "a change that fixes nothing"}
  - reply: {content: done}
"""


def _failed_job(db: Database, settings: Settings, py_repo: Path, tmp_path: Path) -> str:
    """A step whose first attempt fails pytest; the fixes and the escalation change nothing."""
    script = tmp_path / "tries.yaml"
    script.write_text(TRIES)
    tiers = [Tier(name=name, model=f"scripted/{script}") for name in ("local", "premium")]
    config = MerlinConfig(
        tiers=tiers, limits=Limits(fix_attempts=1), environment=Environment(setup=[])
    )
    steps = [{"id": "breaker", "step_type": "Debug", "description": "make answer() 42"}]
    tasklist = parse_tasklist({"title": "t", "steps": steps})
    job_id = create_job(db, settings, tasklist, py_repo, config)
    for n in range(4):  # execute, fix, escalate to premium, fix on premium
        assert execute_step(db, settings, job_id, "breaker", f"a:{n}") is Outcome.CONTINUE
        verify_step(db, settings, job_id, "breaker", f"v:{n}")
    assert finalize_job(db, settings, job_id) == "failed"
    return job_id


def test_the_failing_exit_command_is_the_cause_everywhere(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _failed_job(db, settings, py_repo, tmp_path)
    view = job_view(db, job_id)
    error = view["error"] or ""
    # The job's error: the decisive command, its count and lines, then the later attempts.
    assert error.startswith(
        "step breaker failed on every tier: attempt 1 (execute on tier local): "
        "`python -m pytest -q` exited with code 1: 1 failed in "
    )
    assert "\n    FAILED test_app.py::test_answer - assert 41 == 42" in error
    assert "\nthen attempt 2 (fix on tier local): the attempt changed no file" in error
    assert "; attempt 3 (escalate on tier premium): the attempt changed no file" in error
    assert "; attempt 4 (fix on tier premium): the attempt changed no file" in error
    # --json: the same, structured.
    failure = view["failure"]
    assert failure is not None
    assert (failure["step"], failure["attempt"], failure["kind"], failure["tier"]) == (
        "breaker",
        1,
        "execute",
        "local",
    )
    assert (failure["exit_command"], failure["exit_code"]) == ("python -m pytest -q", 1)
    assert "FAILED test_app.py::test_answer" in failure["tail"]
    assert [(later["attempt"], later["kind"], later["tier"]) for later in failure["later"]] == [
        (2, "fix", "local"),
        (3, "escalate", "premium"),
        (4, "fix", "premium"),
    ]
    assert all("changed no file" in later["reason"] for later in failure["later"])
    # The note under the steps table.
    console = Console(width=200, record=True)
    console.print(failure_notes(view))
    notes = console.export_text()
    assert "breaker: `python -m pytest -q` exited with code 1 (attempt 1, tier local)" in notes
    assert "FAILED test_app.py::test_answer" in notes
    assert "then attempt 4 (fix@premium): the attempt changed no file" in notes
    # JUnit: the failing output, not the last attempt's (empty) one.
    case = ET.fromstring(junit_xml(view)).find(".//testcase/failure")
    assert case is not None
    assert "FAILED test_app.py::test_answer" in (case.text or "")
    assert "exited with code 1" in case.get("message", "")
    # The summary next to the patch.
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert "- error: step breaker failed on every tier: attempt 1" in summary
    # `merlin costs`: what each escalation was for.
    escalations = job_costs(db, job_id)["escalations"]
    assert [(e["from_tier"], e["to_tier"]) for e in escalations] == [("local", "premium")]
    assert "the attempt changed no file" in (escalations[0]["reason"] or "")


def test_a_job_that_never_failed_a_verification_gives_its_last_reason(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    script = tmp_path / "silent.yaml"
    script.write_text("rules:\n  - reply: {content: nothing}\n")
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")],
        limits=Limits(fix_attempts=0),
        environment=Environment(setup=[]),
    )
    tasklist = parse_tasklist({"title": "t", "steps": [{"id": "s", "step_type": "Debug",
                                                         "description": "d"}]})  # fmt: skip
    job_id = create_job(db, settings, tasklist, py_repo, config)
    assert execute_step(db, settings, job_id, "s", "a") is Outcome.CONTINUE
    verify_step(db, settings, job_id, "s", "v")
    view = job_view(db, job_id)
    assert (view["error"] or "").startswith(
        "step s failed on every tier: the attempt changed no file"
    )
    failure = view["failure"]
    assert failure is not None
    assert (failure["attempt"], failure["exit_code"], failure["later"]) == (None, None, [])
    assert failure["reason"].startswith("the attempt changed no file")
