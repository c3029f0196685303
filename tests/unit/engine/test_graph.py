"""Steps as a graph, driven directly (no Celery) on real git, real exit commands and SQLite.

The worker tasks are called by hand in the order a busy fleet could run them: two
siblings started from the same head, one passing before the other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Dispatch, Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.graph import dependencies, dependents, is_complete, is_finished, runnable
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git, make_repo
from tests.unit.engine.graph_jobs import DIAMOND, DIAMOND_RULES, job, run, step, step_rows, write


def test_a_plain_list_is_a_sequence_and_a_graph_is_as_written() -> None:
    roots = parse_tasklist({"title": "t", "steps": [step(k, "true") for k in "abc"]})
    assert dependencies(roots.steps) == [[], [], []]  # `depends_on: []`: each starts at once
    absent = [{k: v for k, v in step(k, "true").items() if k != "depends_on"} for k in "abc"]
    plain = parse_tasklist({"title": "t", "steps": absent})
    assert dependencies(plain.steps) == [[], ["a"], ["b"]]  # no depends_on anywhere
    stored = parse_tasklist(plain.model_dump(mode="json"))  # as a job keeps it
    assert dependencies(stored.steps) == [[], ["a"], ["b"]]
    graph = parse_tasklist({"title": "t", "steps": DIAMOND})
    assert dependencies(graph.steps) == [[], ["a"], ["a"], ["b", "c"]]


class _Node:
    def __init__(self, key: str, status: str = "Pending", *needs: str, owner: str | None = None):
        self.key, self.status, self.depends_on, self.lease_owner = key, status, list(needs), owner


def test_runnable_steps_wait_for_every_dependency_and_the_limit() -> None:
    steps = [
        _Node("a", "Completed"),
        _Node("b", "Pending", "a"),
        _Node("c", "Pending", "a"),
        _Node("d", "Pending", "b", "c"),
        _Node("e", "Pending"),
    ]
    assert [s.key for s in runnable(steps, 4)] == ["b", "c", "e"]
    assert [s.key for s in runnable(steps, 2)] == ["b", "c"]
    steps[1].lease_owner = "queued"  # b is queued: it counts, and is not returned again
    assert [s.key for s in runnable(steps, 2)] == ["c"]
    steps[1].status = "InProgress"
    steps[2].status = "Completed"
    assert [s.key for s in runnable(steps, 4)] == ["e"]  # d still needs b
    assert [s.key for s in dependents(steps, "b")] == ["d"]
    assert [s.key for s in dependents(steps, "a")] == ["b", "c", "d"]
    assert is_finished(["Completed", "Failed", "Skipped"])
    assert not is_complete(["Completed", "Failed", "Skipped"])
    assert not is_finished(["Completed", "Pending"])


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_a_failed_step_skips_what_needs_it_or_stops_the_job(
    db: Database, settings: Settings, tmp_path: Path, policy: str
) -> None:
    job_id, repo = job(
        db,
        settings,
        tmp_path,
        [*DIAMOND[:2], {**DIAMOND[2], "exit_command": "false", "on_failure": policy}, DIAMOND[3]],
        DIAMOND_RULES,
    )
    run(db, settings, job_id, "a")
    assert execute_step(db, settings, job_id, "c", "c:a") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "c", "c:v")[0] is Outcome.RETRY  # a fix first
    outcome, dispatch = run(db, settings, job_id, "c")  # no tier left
    assert (outcome, dispatch) == (Outcome.STOP, Dispatch())
    rows = step_rows(db, job_id)
    assert rows["c"].status == "Failed"
    if policy == "stop":
        assert job_view(db, job_id)["status"] == "failed"
        assert rows["b"].status == "Skipped"  # queued, never started: it will not
        assert execute_step(db, settings, job_id, "b", "b:a") is Outcome.STOP
        return
    assert rows["d"].status == "Skipped"
    assert rows["d"].result == "skipped: needs c, which failed"
    assert rows["b"].status == "Pending"  # the other branch goes on
    assert run(db, settings, job_id, "b") == (Outcome.CONTINUE, Dispatch(finalize=True))
    assert finalize_job(db, settings, job_id) == "partially_completed"
    view = job_view(db, job_id)
    assert view["error"] == "failed: c; skipped: d"
    head = git(repo, "rev-parse", f"merlin/{job_id}")
    assert git(repo, "show", f"{head}:b.txt") == "B"  # b's work is kept
    assert "c.txt" not in git(repo, "ls-tree", "--name-only", head)


def test_max_parallel_steps_bounds_what_starts_at_once(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    steps = [step("root", "true")] + [
        step(key, f"grep -q {key} {key}.txt", "root") for key in ("p", "q", "r")
    ]
    rules = [write("root.txt", "r\n", r"Step root \(")] + [
        write(f"{key}.txt", f"{key}\n", rf"Step {key} \(") for key in ("p", "q", "r")
    ]
    import yaml

    repo = make_repo(tmp_path / "repo", {"README": "r\n"})
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"rules": [*rules, {"reply": {"content": "done"}}]}))
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")], limits=Limits(max_parallel_steps=2)
    )
    job_id = create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)
    assert run(db, settings, job_id, "root")[1] == Dispatch(("p", "q"))
    assert run(db, settings, job_id, "p")[1] == Dispatch(("r",))  # a slot came free
    assert run(db, settings, job_id, "q")[1] == Dispatch()
    assert run(db, settings, job_id, "r")[1] == Dispatch(finalize=True)
    assert finalize_job(db, settings, job_id) == "completed"


def test_resume_of_a_partially_completed_job_queues_every_unfinished_branch(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    from merlin_flow.engine.leases import QUEUED
    from merlin_flow.jobs.control import resume_job

    failing = {**DIAMOND[2], "exit_command": "false", "on_failure": "continue"}
    job_id, _ = job(db, settings, tmp_path, [*DIAMOND[:2], failing, DIAMOND[3]], DIAMOND_RULES)
    run(db, settings, job_id, "a")
    run(db, settings, job_id, "c")
    run(db, settings, job_id, "c")
    run(db, settings, job_id, "b")
    assert finalize_job(db, settings, job_id) == "partially_completed"
    assert resume_job(db, settings, job_id, exit_command="grep -q C c.txt") == "c"
    rows = step_rows(db, job_id)
    assert {key: (row.status, row.lease_owner) for key, row in rows.items()} == {
        "a": ("Completed", None),
        "b": ("Completed", None),
        "c": ("Pending", QUEUED),  # its dependency passed: queued at once
        "d": ("Pending", None),  # waits for c again
    }
    assert run(db, settings, job_id, "c")[1] == Dispatch(("d",))
    assert run(db, settings, job_id, "d")[1] == Dispatch(finalize=True)
    assert finalize_job(db, settings, job_id) == "completed"
