"""End to end on real `merlin worker` processes, real git, real pytest: on the embedded
defaults and on Redis + Postgres."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.jobs.views import job_view
from merlin_flow.store import open_database
from tests.conftest import git
from tests.e2e.conftest import Backend
from tests.e2e.helpers import (
    kill_worker,
    merlin,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)

pytestmark = pytest.mark.e2e


def _submit(env: dict[str, str], tasklist: Path, repo: Path, config: Path) -> str:
    result = merlin(
        env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stderr
    job_id: str = json.loads(result.stdout)["job_id"]
    return job_id


def _checkout_state(repo: Path) -> tuple[str, str, str, str]:
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "rev-parse", "--abbrev-ref", "HEAD"),
        git(repo, "status", "--porcelain"),
        (repo / "app.py").read_text(),
    )


def test_three_step_job_on_a_worker_process(
    tmp_path: Path, py_repo: Path, backend: Backend
) -> None:
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    tasklist, config = write_job_files(tmp_path / "job")
    before = _checkout_state(py_repo)
    worker = start_worker(env, tmp_path / "worker.log")
    try:
        job_id = _submit(env, tasklist, py_repo, config)
        db = backend.open(home)
        view = wait_for(
            lambda: (v := job_view(db, job_id))["finished_at"] and v, 120, "the job to finish"
        )
    finally:
        stop_worker(worker)
    assert view["status"] == "completed", (tmp_path / "worker.log").read_text()[-3000:]

    status = status_json(env, job_id)
    assert status["id"] == job_id
    assert status["status"] == "completed"
    assert status["branch"] == f"merlin/{job_id}"
    assert status["error"] is None
    assert status["cost_usd"] > 0
    assert [s["id"] for s in status["steps"]] == ["fix", "slow", "docs"]
    for step in status["steps"]:
        assert step["status"] == "Completed"
        assert step["tier"] == "local"
        assert [(a["tier"], a["kind"], a["exit_code"]) for a in step["attempts"]] == [
            ("local", "execute", 0)
        ]
    assert status["steps"][2]["exit_command"] == "test -f README.md"
    assert status["steps"][0]["exit_command"] == "python -m pytest -q"

    # One commit per step on the job branch, holding the steps' work.
    commits = git(py_repo, "rev-list", "--reverse", f"main..merlin/{job_id}").splitlines()
    assert len(commits) == 3
    assert git(py_repo, "show", f"merlin/{job_id}:app.py").strip().endswith("return 42")
    assert "double" in git(py_repo, "show", f"merlin/{job_id}:double.py")
    # The user's checkout is untouched: same HEAD, branch, clean tree, same file.
    assert _checkout_state(py_repo) == before
    patch = Path(status["patch"]).read_text()
    assert "+    return 42" in patch


def _attempt_rows(db: Any, job_id: str) -> list[tuple[str, int, str, int]]:
    from sqlalchemy import select

    from merlin_flow.store import Attempt, Step

    with db.session() as session:
        rows = session.execute(
            select(Step.key, Attempt.number, Attempt.status, Attempt.runs)
            .join(Attempt, Attempt.step_id == Step.id)
            .where(Step.job_id == job_id)
        ).all()
        return [tuple(row) for row in rows]


def _journal(db: Any, job_id: str) -> list[tuple[str, int, int, bool]]:
    from sqlalchemy import select

    from merlin_flow.store import LlmCall, Step

    with db.reader() as session:
        rows = session.execute(
            select(Step.key, LlmCall.run, LlmCall.turn, LlmCall.replayed)
            .join(Step, Step.id == LlmCall.step_id)
            .where(LlmCall.job_id == job_id)
            .order_by(LlmCall.seq)
        ).all()
        return [tuple(row) for row in rows]


def test_job_survives_a_worker_killed_mid_step(
    tmp_path: Path, py_repo: Path, backend: Backend
) -> None:
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    tasklist, config = write_job_files(tmp_path / "job", sleep_seconds=4, lease_seconds=2)
    log = tmp_path / "worker.log"
    first = start_worker(env, log)
    second = None
    try:
        job_id = _submit(env, tasklist, py_repo, config)
        db = backend.open(home)
        # Kill the whole worker (main process and pool) while step "slow" is in its
        # attempt, after its first model call was paid for (its tool is now sleeping).
        wait_for(
            lambda: (
                ("slow", 1, "running", 1) in _attempt_rows(db, job_id)
                and ("slow", 1, 0, False) in _journal(db, job_id)
            ),
            90,
            "step 'slow' to make its first model call",
        )
        fix_before = [r for r in _attempt_rows(db, job_id) if r[0] == "fix"]
        kill_worker(first)
        assert job_view(db, job_id)["status"] == "running"

        second = start_worker(env, log)
        max_running: dict[str, int] = {}

        def finished() -> bool:
            rows = _attempt_rows(db, job_id)
            for key in {r[0] for r in rows}:
                running = sum(1 for r in rows if r[0] == key and r[2] == "running")
                max_running[key] = max(max_running.get(key, 0), running)
            return job_view(db, job_id)["finished_at"] is not None

        wait_for(finished, 120, "the job to finish after recovery", poll=0.1)
    finally:
        kill_worker(first)
        if second is not None:
            stop_worker(second)
    view = job_view(db, job_id)
    assert view["status"] == "completed", log.read_text()[-4000:]
    rows = _attempt_rows(db, job_id)
    # The completed step was not re-run: still its one attempt, run once.
    assert [r for r in rows if r[0] == "fix"] == fix_before == [("fix", 1, "passed", 1)]
    # The interrupted attempt was resumed in place (same row, a second run), then passed.
    assert [r for r in rows if r[0] == "slow"] == [("slow", 1, "passed", 2)]
    assert max(max_running.values()) <= 1
    slow = next(s for s in view["steps"] if s["id"] == "slow")
    assert slow["recoveries"] == 1
    assert len(git(py_repo, "rev-list", f"main..merlin/{job_id}").splitlines()) == 3

    # The journal: the call made before the kill was replayed, not paid twice.
    calls = _journal(db, job_id)
    assert ("slow", 1, 0, False) in calls  # run 1 paid for turn 0 ...
    assert ("slow", 2, 0, True) in calls  # ... run 2 replayed it
    paid = [(key, turn) for key, _run, turn, replayed in calls if not replayed]
    assert len(paid) == len(set(paid))  # no turn of any attempt paid twice
    # And the job costs what the same job costs without a crash.
    clean_env = merlin_env(tmp_path / "clean-home")
    clean_repo = tmp_path / "clean-repo"
    git(tmp_path, "clone", "-q", str(py_repo), str(clean_repo))
    clean = merlin(
        clean_env,
        "run",
        str(tasklist),
        "--repo",
        str(clean_repo),
        "--config",
        str(config),
        "--json",
    )
    assert clean.returncode == 0, clean.stderr
    assert view["cost_usd"] == pytest.approx(json.loads(clean.stdout)["cost_usd"], abs=1e-9)
    assert view["cost_usd"] > 0


def test_status_of_a_pending_job_without_workers(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    job_id = _submit(env, tasklist, py_repo, config)
    status = status_json(env, job_id)
    assert status["status"] == "pending"
    assert [s["status"] for s in status["steps"]] == ["Pending"] * 3
    listing = json.loads(merlin(env, "list", "--json").stdout)
    assert [(j["id"], j["status"]) for j in listing] == [(job_id, "pending")]
    assert {"id", "status", "title", "repo", "created_at"} <= set(listing[0])
    time.sleep(0)  # no worker: nothing else happens


def test_two_workers_on_different_queues_and_folders(
    tmp_path: Path, py_repo: Path, backend: Backend
) -> None:
    """The Procfile layout: a threads worker for llm+control, a prefork one for verify."""
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    tasklist, config = write_job_files(tmp_path / "job")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    log_a, log_b = tmp_path / "llm.log", tmp_path / "verify.log"
    llm = start_worker(
        env, log_a, "--queues", "llm,control", "--pool", "threads", cwd=tmp_path / "a"
    )
    verify = start_worker(env, log_b, "--queues", "verify", cwd=tmp_path / "b")
    try:
        # --wait blocks until the job ends and exits like `merlin run`.
        waited = merlin(
            env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config),
            "--wait", "--json",
        )  # fmt: skip
    finally:
        stop_worker(llm)
        stop_worker(verify)
    assert waited.returncode == 0, waited.stderr
    view = json.loads(waited.stdout)
    assert view["status"] == "completed", log_a.read_text()[-2000:] + log_b.read_text()[-2000:]
    llm_log, verify_log = log_a.read_text(), log_b.read_text()
    assert llm_log.count("merlin.step[") >= 3
    assert "merlin.finalize[" in llm_log
    assert "merlin.verify[" not in llm_log
    assert verify_log.count("merlin.verify[") >= 3
    assert "merlin.step[" not in verify_log


SLEEP = 17.5
"""Seconds of the command step 'slow' runs first: far longer than a bounded shutdown."""
SLOW_ALONE = """\
title: One slow step
steps:
  - id: slow
    step_type: Feature
    description: add double(x) with a test
    exit_command: python -m pytest -q test_double.py
"""


def _commands_left() -> str:
    return subprocess.run(
        ["pgrep", "-f", f"sleep {SLEEP:g}"], capture_output=True, text=True, check=False
    ).stdout.strip()


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_sigterm_hands_a_running_step_back_instead_of_waiting_for_it(
    tmp_path: Path, py_repo: Path, pool: str
) -> None:
    """Issue 45: SIGTERM waited for the running step (a 40 s command: 42 s to exit).

    Now the step gets --shutdown-grace seconds, then its process (or, with threads, the
    worker) is stopped and the step handed back with no loss counted; another worker
    resumes the same attempt, replaying its paid model call, and the job completes.
    """
    home = tmp_path / "home"
    env = merlin_env(home)
    tasklist, config = write_job_files(
        tmp_path / "job", tasklist=SLOW_ALONE, sleep_seconds=SLEEP, lease_seconds=30
    )
    log = tmp_path / "worker.log"
    first = start_worker(env, log, "--pool", pool, "--shutdown-grace", "1")
    second = None
    job_id = _submit(env, tasklist, py_repo, config)
    db = open_database(f"sqlite:///{home / 'merlin.db'}")
    try:
        wait_for(
            lambda: ("slow", 1, "running", 1) in _attempt_rows(db, job_id) and _commands_left(),
            90,
            "step 'slow' to run its command",
        )
        started = time.monotonic()
        os.kill(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
        took = time.monotonic() - started
        assert first.returncode == 0, log.read_text()[-3000:]
        assert took < SLEEP - 5, f"{took:.1f} s from SIGTERM to exit"
        assert _commands_left() == ""  # the command died with its task
        view = job_view(db, job_id)
        assert view["status"] == "running"
        assert (view["steps"][0]["recoveries"], view["steps"][0]["status"]) == (0, "InProgress")
        assert "steps handed back to the queue: " + f"{job_id} slow" in log.read_text()

        second = start_worker(env, log)
        wait_for(lambda: job_view(db, job_id)["finished_at"], 120, "the job to finish")
        view = job_view(db, job_id)
        assert view["status"] == "completed", log.read_text()[-4000:]
        # The same attempt, resumed once: nothing counted against the step, nor paid twice.
        assert _attempt_rows(db, job_id) == [("slow", 1, "passed", 2)]
        assert view["steps"][0]["recoveries"] == 0
        calls = _journal(db, job_id)
        assert ("slow", 1, 0, False) in calls  # run 1 paid for turn 0 ...
        assert ("slow", 2, 0, True) in calls  # ... run 2 replayed it
        paid = [(key, turn) for key, _run, turn, replayed in calls if not replayed]
        assert len(paid) == len(set(paid))
    finally:
        kill_worker(first)
        if second is not None:
            stop_worker(second)
        db.dispose()
