"""Reports of finished jobs: JUnit XML for CI, the Markdown summary, atomic writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.reports import junit_xml, write_atomically
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist

SCRIPT = """\
rules:
  - match: 'Step fix \\('
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - match: 'Step docs \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: NOTES.md, content: "why and how\\n"}
  - reply: {content: done}
"""


def _finished_job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, exit_command: str, **tier: float
) -> str:
    """Two Debug steps with ``exit_command``, worked to the end on one scripted tier."""
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}", **tier)],
        limits=Limits(fix_attempts=0),
        exit_commands={"Debug": exit_command},
    )
    steps = [
        {"id": "fix", "step_type": "Debug", "description": "answer 42"},
        {"id": "docs", "step_type": "Debug", "description": "say <why> & how"},
    ]
    job_id = create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)
    for key in ("fix", "docs"):
        execute_step(db, settings, job_id, key, f"{key}:a")
        verify_step(db, settings, job_id, key, f"{key}:b")
    finalize_job(db, settings, job_id)
    return job_id


def _suite(xml: str) -> ET.Element:
    suite = ET.fromstring(xml.split("?>", 1)[1]).find("testsuite")
    assert suite is not None
    return suite


def test_a_completed_step_passes_with_its_attempts_and_exit_command(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _finished_job(db, settings, py_repo, tmp_path, "true", price_in=1.0, price_out=1.0)
    view = job_view(db, job_id)
    suite = _suite(junit_xml(view))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "0", "0")
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == ["fix (Debug)", "docs (Debug)"]
    out = cases[0].findtext("system-out") or ""
    assert "execute@local -> passed (exit code 0)" in out
    assert "exit command: true" in out
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["merlin.status"] == "completed"
    assert float(properties["merlin.cost_usd"] or "nan") == pytest.approx(view["cost_usd"])


def test_a_failed_step_is_a_failure_and_the_steps_after_it_are_skipped(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = _finished_job(db, settings, py_repo, tmp_path, "sh -c \"echo 'boom <&>'; exit 3\"")
    view = job_view(db, job_id)
    suite = _suite(junit_xml(view))
    assert [s["status"] for s in view["steps"]] == ["Failed", "Skipped"]
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "1")
    fix, docs = suite.findall("testcase")
    failure = fix.find("failure")
    assert failure is not None
    assert "failed on every tier" in (failure.get("message") or "")
    assert "boom <&>" in (failure.text or "")  # the exit command's output, escaped in XML
    assert "(exit code 3)" in (failure.text or "")
    assert docs.find("skipped") is not None
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["merlin.cost_usd"] == "0.0"  # the scripted model is free
    unpriced = _suite(junit_xml({**view, "cost_usd": None}))  # calls of unknown price
    properties = {p.get("name"): p.get("value") for p in unpriced.iter("property")}
    assert properties["merlin.cost_usd"] == "unknown"


def test_a_report_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "reports" / "junit.xml"
    write_atomically(target, "first")
    write_atomically(target, "second")
    assert target.read_text() == "second"
    blocked = tmp_path / "reports" / "taken"
    blocked.mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomically(blocked, "text")  # a folder is in the way: the rename fails
    assert sorted(p.name for p in target.parent.iterdir()) == ["junit.xml", "taken"]
