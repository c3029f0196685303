"""`merlin demo --submit`: the demo on real workers, its parallel steps side by side.

`merlin demo` works one task at a time in its own process. A team runs the demo on its
workers first, where `guard` and `median` (both needing only `fix`) run at once from the
same head: the one that passes second is merged onto the other and verified again. Both
pools (prefork, the default; threads with `-c 4`) and both brokers (the embedded one;
Redis, with Postgres) run it, with the scripts the demo ships.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select

from merlin_flow.jobs.views import job_view
from merlin_flow.store import Event
from tests.conftest import git
from tests.e2e.conftest import Backend
from tests.e2e.helpers import merlin, merlin_env, start_worker, stop_worker

pytestmark = pytest.mark.e2e

POOLS = {"embedded": ("--pool", "prefork", "--concurrency", "2"),
         "redis+postgres": ("--pool", "threads", "--concurrency", "4")}  # fmt: skip
"""The pool each backend's worker runs: between them, both pools and both brokers."""


def _found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in:\n{text}"
    return match[1]


def test_the_demo_tasklist_completes_on_workers(tmp_path: Path, backend: Backend) -> None:
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    worker = start_worker(env, tmp_path / "worker.log", *POOLS[backend.name])
    try:
        demo = merlin(env, "demo", "--submit", timeout=240)
    finally:
        stop_worker(worker)
    log = (tmp_path / "worker.log").read_text()[-3000:]
    assert demo.returncode == 0, f"{demo.stdout}\n{demo.stderr}\n{log}"
    repo = Path(_found(r"throwaway repository: (\S+)", demo.stdout))
    job_id = _found(r"job ([0-9a-f]{12}) submitted to the workers", demo.stdout)
    assert f"job {job_id} completed: branch merlin/{job_id}" in demo.stdout
    assert "merged onto" in demo.stdout  # the integration, as it is shown
    db = backend.open(home)
    view = job_view(db, job_id)
    assert view["status"] == "completed"
    attempts = {
        step["id"]: [(a["kind"], a["tier"], a["exit_code"]) for a in step["attempts"]]
        for step in view["steps"]
    }
    assert attempts == {
        "fix": [("execute", "local", 1), ("fix", "local", 1), ("escalate", "premium", 0)],
        "guard": [("execute", "local", 0)],
        "median": [("execute", "local", 0)],
    }
    with db.reader() as session:
        events = session.scalars(select(Event).where(Event.job_id == job_id)).all()
        order = [(e.kind, e.step_key) for e in events]
        merged = [e for e in events if e.kind == "step_integrated"]
    # Side by side: both started from fix's commit, before either passed ...
    first_pass = min(order.index(("step_completed", key)) for key in ("guard", "median"))
    assert order.index(("step_started", "guard")) < first_pass
    assert order.index(("step_started", "median")) < first_pass
    # ... so the second to pass was merged onto the first and verified again.
    assert len(merged) == 1
    assert merged[0].step_key in ("guard", "median")
    assert merged[0].data["commands"] == ["python -m pytest -q"]
    branch = f"merlin/{job_id}"
    assert "raise ValueError" in git(repo, "show", f"{branch}:calc.py")
    assert "def median" in git(repo, "show", f"{branch}:calc.py")
    assert "test_median" in git(repo, "show", f"{branch}:test_median.py")
    assert "test_mean_of_empty_list" in git(repo, "show", f"{branch}:test_calc.py")
