"""TaskLists as graphs, end to end: real `merlin worker` processes, real git, real exit commands.

The scripted model waits (``delay``) so that siblings run at the same time on two
workers; the database's attempt rows say when each ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from merlin_flow.jobs.reports import junit_xml
from merlin_flow.jobs.views import job_view
from merlin_flow.store import Attempt, Database, LlmCall, Step, open_database
from tests.conftest import git, make_repo
from tests.e2e.conftest import Backend
from tests.e2e.helpers import (
    kill_worker,
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
)

pytestmark = pytest.mark.e2e

CONFIG = """\
[[tiers]]
name = "local"
model = "scripted/local.yaml"
price_in = 1.0
price_out = 2.0

[limits]
fix_attempts = FIXES
lease_seconds = LEASE
"""


def _write(path: str, content: str, match: str, delay: float = 0.0) -> dict[str, Any]:
    call = {"name": "write_file", "arguments": {"path": path, "content": content}}
    return {"match": match, "turn": 0, "reply": {"delay": delay, "tool_calls": [call]}}


def _step(key: str, command: str, *needs: str, **more: Any) -> dict[str, Any]:
    step = {"id": key, "step_type": "Feature", "description": f"do {key}", "exit_command": command}
    return {**step, "depends_on": list(needs), **more}


def _files(
    folder: Path,
    steps: list[dict[str, Any]],
    rules: list[dict[str, Any]],
    fixes: int = 1,
    lease: float = 60,
) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    script = {"rules": [*rules, {"reply": {"content": "done"}}]}
    (folder / "local.yaml").write_text(yaml.safe_dump(script))
    config = folder / "merlin.toml"
    config.write_text(CONFIG.replace("FIXES", str(fixes)).replace("LEASE", f"{lease:g}"))
    tasklist = folder / "graph.yaml"
    tasklist.write_text(yaml.safe_dump({"title": "a graph", "steps": steps}))
    return tasklist, config


def _submit(env: dict[str, str], tasklist: Path, repo: Path, config: Path) -> str:
    result = merlin(
        env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stderr
    job_id: str = json.loads(result.stdout)["job_id"]
    return job_id


def _attempts(db: Database, job_id: str) -> list[Any]:
    with db.reader() as session:
        return list(
            session.execute(
                select(
                    Step.key,
                    Attempt.number,
                    Attempt.kind,
                    Attempt.status,
                    Attempt.start_commit,
                    Attempt.started_at,
                    Attempt.finished_at,
                    Attempt.runs,
                )
                .join(Attempt, Attempt.step_id == Step.id)
                .where(Step.job_id == job_id)
                .order_by(Attempt.id)
            ).all()
        )


def _finished(db: Database, job_id: str, timeout: float = 150) -> dict[str, Any]:
    view: dict[str, Any] = wait_for(
        lambda: (v := job_view(db, job_id))["finished_at"] and v, timeout, "the job to finish"
    )
    return view


def _overlap(one: Any, other: Any) -> bool:
    return bool(one.started_at < other.finished_at and other.started_at < one.finished_at)


DIAMOND = [
    _step("a", "grep -q A a.txt"),
    _step("b", "grep -q B b.txt", "a"),
    _step("c", "grep -q C c.txt", "a"),
    _step("d", "sh -c 'grep -q B b.txt && grep -q C c.txt && grep -q D d.txt'", "b", "c"),
]


def test_a_diamond_runs_its_siblings_at_once_on_two_workers(
    tmp_path: Path, backend: Backend
) -> None:
    repo = make_repo(tmp_path / "repo", {"README": "r\n"})
    rules = [
        _write("a.txt", "A\n", r"Step a \("),
        _write("b.txt", "B\n", r"Step b \(", delay=3),
        _write("c.txt", "C\n", r"Step c \(", delay=3),
        _write("d.txt", "D\n", r"Step d \("),
    ]
    tasklist, config = _files(tmp_path / "job", DIAMOND, rules)
    home = tmp_path / "home"
    env = merlin_env(home, **backend.env)
    workers = [start_worker(env, tmp_path / f"worker{n}.log") for n in (1, 2)]
    try:
        job_id = _submit(env, tasklist, repo, config)
        view = _finished(backend.open(home), job_id)
    finally:
        for worker in workers:
            stop_worker(worker)
    logs = "".join((tmp_path / f"worker{n}.log").read_text()[-2000:] for n in (1, 2))
    assert view["status"] == "completed", logs
    assert view["finished"]
    assert view["complete"]
    rows = {row.key: row for row in _attempts(backend.open(home), job_id)}
    assert _overlap(rows["b"], rows["c"])  # the siblings ran at the same time
    assert rows["b"].start_commit == rows["c"].start_commit  # from a's head, both
    start = rows["d"].start_commit  # d started from a tree holding both
    assert git(repo, "show", f"{start}:b.txt") == "B"
    assert git(repo, "show", f"{start}:c.txt") == "C"
    assert [s["depends_on"] for s in view["steps"]] == [[], ["a"], ["a"], ["b", "c"]]
    # One commit per step: the second sibling's was merged onto the first's.
    assert len(git(repo, "rev-list", f"main..merlin/{job_id}").splitlines()) == 4


def test_siblings_that_edit_the_same_lines_integrate_one_after_the_other(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"shared.txt": "x\n"})
    steps = [
        _step("a", "true"),
        _step("b", "grep -q B shared.txt", "a"),
        _step("c", "grep -q C shared.txt", "a"),
    ]
    rules = [
        _write("a.txt", "A\n", r"Step a \("),
        # The attempt told that the branch moved keeps the sibling's line and adds its own.
        _write("shared.txt", "B\nC\n", r"(?s)Step [bc] \(.*moved the job branch"),
        _write("shared.txt", "B\n", r"Step b \(", delay=2),
        _write("shared.txt", "C\n", r"Step c \(", delay=2),
    ]
    tasklist, config = _files(tmp_path / "job", steps, rules)
    home = tmp_path / "home"
    env = merlin_env(home)
    workers = [start_worker(env, tmp_path / f"worker{n}.log") for n in (1, 2)]
    try:
        job_id = _submit(env, tasklist, repo, config)
        view = _finished(open_database(f"sqlite:///{home / 'merlin.db'}"), job_id)
    finally:
        for worker in workers:
            stop_worker(worker)
    assert view["status"] == "completed", (tmp_path / "worker1.log").read_text()[-3000:]
    attempts = {(s["id"], a["kind"], a["status"]) for s in view["steps"] for a in s["attempts"]}
    # One of b and c passed first; the other conflicted and passed on its integrate attempt.
    second = "c" if (("c", "integrate", "passed") in attempts) else "b"
    assert (second, "execute", "failed") in attempts
    assert (second, "integrate", "passed") in attempts
    failed = next(s for s in view["steps"] if s["id"] == second)["attempts"][0]
    assert failed["error"].startswith("integration failed: the step's change conflicts")
    head = f"merlin/{job_id}"
    assert git(repo, "show", f"{head}:shared.txt") == "B\nC"  # passes every exit command


def _slow_sibling_rules(delay: float) -> list[dict[str, Any]]:
    """b takes several slow turns; c fails at once; a and d are quick."""
    return [
        _write("a.txt", "A\n", r"Step a \("),
        *[
            {
                "match": r"Step b \(",
                "turn": turn,
                "reply": {
                    "delay": delay,
                    "tool_calls": [{"name": "list_files", "arguments": {"path": "."}}],
                },
            }
            for turn in range(4)
        ],
        {**_write("b.txt", "B\n", r"Step b \("), "turn": 4},
        _write("c.txt", "wrong\n", r"Step c \("),
        _write("d.txt", "D\n", r"Step d \("),
    ]


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_a_failing_step_skips_its_dependents_or_cancels_its_siblings(
    tmp_path: Path, policy: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"README": "r\n"})
    steps = [*DIAMOND[:2], {**DIAMOND[2], "on_failure": policy}, DIAMOND[3]]
    tasklist, config = _files(tmp_path / "job", steps, _slow_sibling_rules(1.5), fixes=0)
    home = tmp_path / "home"
    env = merlin_env(home)
    workers = [start_worker(env, tmp_path / f"worker{n}.log") for n in (1, 2)]
    try:
        job_id = _submit(env, tasklist, repo, config)
        view = _finished(open_database(f"sqlite:///{home / 'merlin.db'}"), job_id)
    finally:
        for worker in workers:
            stop_worker(worker)
    view = job_view(open_database(f"sqlite:///{home / 'merlin.db'}"), job_id)
    steps_by_key = {s["id"]: s for s in view["steps"]}
    assert steps_by_key["c"]["status"] == "Failed"
    if policy == "stop":
        assert view["status"] == "failed"
        assert view["finished"]
        assert not view["complete"]
        # b was running: cancelled at its next model call, its work never merged.
        assert [a["status"] for a in steps_by_key["b"]["attempts"]] == ["cancelled"]
        assert "b.txt" not in git(repo, "ls-tree", "--name-only", f"merlin/{job_id}")
        return
    assert view["status"] == "partially_completed"
    assert view["finished"]
    assert not view["complete"]
    assert steps_by_key["b"]["status"] == "Completed"
    assert steps_by_key["d"]["status"] == "Skipped"
    assert steps_by_key["d"]["result"] == "skipped: needs c, which failed"
    assert git(repo, "show", f"merlin/{job_id}:b.txt") == "B"  # b's work is kept
    text = junit_xml(view)  # what `merlin run --junit` writes
    assert text.count("<testcase") == 4
    assert '<skipped message="skipped: needs c, which failed"' in text


def test_a_worker_killed_while_two_steps_run_loses_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README": "r\n"})
    rules = [
        _write("a.txt", "A\n", r"Step a \("),
        *[
            {
                "match": rf"Step {key} \(",
                "turn": 0,
                "reply": {
                    "delay": 1,
                    "tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 4"}}],
                },
            }
            for key in "bc"
        ],
        _write("b.txt", "B\n", r"(?s)Step b \(.*sleep 4"),
        _write("c.txt", "C\n", r"(?s)Step c \(.*sleep 4"),
        _write("d.txt", "D\n", r"Step d \("),
    ]
    for rule in rules[3:5]:
        rule["turn"] = 1
    tasklist, config = _files(tmp_path / "job", DIAMOND, rules, lease=2)
    home = tmp_path / "home"
    env = merlin_env(home)
    log = tmp_path / "worker.log"
    first, second = start_worker(env, log), start_worker(env, log)
    third = None
    try:
        job_id = _submit(env, tasklist, repo, config)
        db = open_database(f"sqlite:///{home / 'merlin.db'}")

        def both_running() -> bool:
            running = {r.key for r in _attempts(db, job_id) if r.status == "running"}
            return running == {"b", "c"}

        wait_for(both_running, 90, "steps b and c to run at once")
        kill_worker(first)
        third = start_worker(env, log)
        max_running: dict[str, int] = {}

        def finished() -> bool:
            for key in "abcd":
                rows = [r for r in _attempts(db, job_id) if r.key == key]
                running = sum(1 for r in rows if r.status == "running")
                max_running[key] = max(max_running.get(key, 0), running)
            return job_view(db, job_id)["finished_at"] is not None

        wait_for(finished, 150, "the job to finish after the kill", poll=0.1)
    finally:
        kill_worker(first)
        for worker in (second, third):
            if worker is not None:
                stop_worker(worker)
    view = job_view(db, job_id)
    assert view["status"] == "completed", log.read_text()[-4000:]
    assert max(max_running.values()) <= 1  # no step ran twice at once
    assert sum(s["recoveries"] for s in view["steps"]) >= 1
    with db.reader() as session:
        paid = session.execute(
            select(LlmCall.attempt_id, LlmCall.turn).where(
                LlmCall.job_id == job_id, LlmCall.replayed.is_(False)
            )
        ).all()
    assert len(paid) == len(set(paid))  # no model call paid twice
    head = f"merlin/{job_id}"
    for name, content in (("b.txt", "B"), ("c.txt", "C"), ("d.txt", "D")):
        assert git(repo, "show", f"{head}:{name}") == content
