"""The read commands import what they use: no model calls, no broker, no agent stack.

Each command runs as ``python -m merlin_flow.cli ...`` in a fresh process on a
MERLIN_HOME holding jobs, and the modules it loaded are read at its exit (issue 36: a
read answers at once). ``--help`` is checked by ``tests/unit/test_public_api.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from merlin_flow.cli.common import state
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.store import Job, JobStatus
from tests.unit.scripted_jobs import scripted_job

HEAVY = ("litellm", "celery", "kombu", "merlin_flow.agents", "merlin_flow.tools")
"""What no read may import: model calls, the broker, the agent and its tools."""
SCHEMA_ONLY = ("alembic",)
"""Imported to migrate; a read of a database at the head checks it with one query."""

# Run the CLI as `merlin` runs it; at exit, whatever made it exit, write sys.modules.
RUN = """\
import atexit, json, runpy, sys
out, args = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["merlin", *args]
runpy.run_module("merlin_flow.cli", run_name="__main__")
"""


def loaded(tmp_path: Path, *args: str) -> list[str]:
    """Those of HEAVY and SCHEMA_ONLY that ``merlin ARGS`` loaded (it must exit 0)."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(out), *args],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    modules = json.loads(out.read_text())
    out.unlink()
    return [
        package
        for package in HEAVY + SCHEMA_ONLY
        if any(name == package or name.startswith(f"{package}.") for name in modules)
    ]


@pytest.fixture
def finished(merlin_home: Path, py_repo: Path, tmp_path: Path) -> str:
    """A one-step job in MERLIN_HOME, worked, verified and closed: completed."""
    settings, db = state()
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    finalize_job(db, settings, job_id)
    db.dispose()
    return job_id


@pytest.fixture
def submitted(merlin_home: Path, py_repo: Path, tmp_path: Path) -> str:
    """A one-step job in MERLIN_HOME that no worker has started."""
    settings, db = state()
    job_id = scripted_job(db, settings, py_repo, tmp_path)
    db.dispose()
    return job_id


def test_the_read_commands_import_neither_models_broker_nor_agents(
    finished: str, tmp_path: Path
) -> None:
    reads = [
        ["list", "--json"],
        ["list"],
        ["status", finished, "--json"],
        ["status", finished],
        ["logs", finished],
        ["costs", finished],
        ["costs", "--since", "7d"],
        ["costs", "--routing"],
        ["approve", "--help"],
        ["reject", "--help"],
    ]
    found = {" ".join(args): loaded(tmp_path, *args) for args in reads}
    assert {command: modules for command, modules in found.items() if modules} == {}


def test_the_status_of_a_job_not_finished_as_json_imports_none_of_them(
    submitted: str, tmp_path: Path
) -> None:
    assert loaded(tmp_path, "status", submitted, "--json") == []


def test_the_status_of_a_job_not_finished_imports_none_of_them(
    submitted: str, tmp_path: Path
) -> None:
    assert loaded(tmp_path, "status", submitted) == []


def test_reject_imports_no_agent_stack(submitted: str, tmp_path: Path) -> None:
    _, db = state()
    with db.session() as session:
        session.get_one(Job, submitted).status = JobStatus.AWAITING_APPROVAL
    db.dispose()
    assert loaded(tmp_path, "reject", submitted) == []
