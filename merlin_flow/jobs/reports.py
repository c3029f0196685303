"""Reports of a finished job for CI: JUnit XML (a test case per step), written atomically.

Files for pipelines are written atomically (a temporary file renamed into place), so a
pipeline never reads half a report. The Markdown summary finalize writes beside the patch
is the engine's (``merlin_flow.engine.summary``).
"""

from __future__ import annotations

import os
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from merlin_flow.store.status import StepStatus

if TYPE_CHECKING:
    from merlin_flow.jobs.views import JobView


def junit_xml(view: JobView) -> str:
    """The job (``views.job_view``) as a JUnit XML document: a test case per step."""
    steps = view["steps"]
    failures = sum(1 for s in steps if s["status"] == StepStatus.FAILED)
    unfinished = (StepStatus.SKIPPED, StepStatus.PENDING, StepStatus.IN_PROGRESS)
    skipped = sum(1 for s in steps if s["status"] in unfinished)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"merlin job {view['id']}: {view['title']}",
        tests=str(len(steps)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time=f"{_seconds(view['started_at'], view['finished_at']):.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name in ("id", "status", "branch", "base_commit", "head_commit", "cost_usd"):
        value = str(view[name]) if view[name] is not None else ""
        value = "unknown" if name == "cost_usd" and view[name] is None else value
        ET.SubElement(properties, "property", name=f"merlin.{name}", value=value)
    for step in steps:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"merlin.{view['id']}",
            name=f"{step['id']} ({step['step_type']})",
            time=f"{_seconds(step.get('started_at'), step.get('finished_at')):.3f}",
        )
        attempts = "\n".join(
            f"attempt {a['number']}: {a['kind']}@{a['tier']} -> {a['status']}"
            + (f" (exit code {a['exit_code']})" if a["exit_code"] is not None else "")
            for a in step["attempts"]
        )
        if step["status"] == StepStatus.FAILED:
            failure = ET.SubElement(case, "failure", message=(step["error"] or "failed")[:500])
            # The decisive output: the last attempt whose exit command failed.
            ran = [a for a in step["attempts"] if a["exit_code"]]
            last = ran[-1] if ran else (step["attempts"][-1] if step["attempts"] else None)
            tail = (last["output_tail"] if last else None) or ""
            failure.text = f"{attempts}\n\n{tail}".strip()
        elif step["status"] != StepStatus.COMPLETED:
            ET.SubElement(case, "skipped", message=step["result"] or "not run")
        else:
            ET.SubElement(
                case, "system-out"
            ).text = f"{attempts}\nexit command: {step['exit_command']}"
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_atomically(path: Path, text: str | bytes) -> None:
    """Write ``text`` (UTF-8, or bytes as they are) to ``path`` through a temporary file."""
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(text if isinstance(text, bytes) else text.encode("utf-8"))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _seconds(started: str | None, finished: str | None) -> float:
    if not started or not finished:
        return 0.0
    begin = datetime.fromisoformat(started.removesuffix("Z"))
    end = datetime.fromisoformat(finished.removesuffix("Z"))
    return max(0.0, (end - begin).total_seconds())
