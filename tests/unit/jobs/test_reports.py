"""Reports of finished jobs: JUnit XML for CI, the Markdown summary, atomic writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from merlin_flow.jobs.reports import junit_xml, write_atomically
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from tests.unit.engine.finished_jobs import finished_job


def _suite(xml: str) -> ET.Element:
    suite = ET.fromstring(xml.split("?>", 1)[1]).find("testsuite")
    assert suite is not None
    return suite


def test_a_completed_step_passes_with_its_attempts_and_exit_command(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = finished_job(db, settings, py_repo, tmp_path, "true", price_in=1.0, price_out=1.0)
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
    job_id = finished_job(db, settings, py_repo, tmp_path, "sh -c \"echo 'boom <&>'; exit 3\"")
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
