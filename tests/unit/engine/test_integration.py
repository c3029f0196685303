"""A passed step merged onto a branch its siblings moved, and verified again."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Dispatch, Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event
from tests.conftest import git
from tests.unit.engine.graph_jobs import DIAMOND, DIAMOND_RULES, job, run, step, step_rows, write


def _events(db: Database, job_id: str, kind: str) -> list[Event]:
    with db.reader() as session:
        return list(
            session.scalars(select(Event).where(Event.job_id == job_id, Event.kind == kind))
        )


def test_a_diamond_runs_its_siblings_from_one_head_and_merges_the_second(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    job_id, repo = job(db, settings, tmp_path, DIAMOND, DIAMOND_RULES)
    assert job_view(db, job_id)["steps"][0]["depends_on"] == []
    assert run(db, settings, job_id, "a") == (Outcome.CONTINUE, Dispatch(("b", "c")))
    # b and c start from the same head (a's), as two workers would run them.
    assert execute_step(db, settings, job_id, "b", "b:a") is Outcome.CONTINUE
    assert execute_step(db, settings, job_id, "c", "c:a") is Outcome.CONTINUE
    rows = step_rows(db, job_id)
    assert rows["b"].attempts[0].start_commit == rows["c"].attempts[0].start_commit
    assert verify_step(db, settings, job_id, "b", "b:v") == (Outcome.CONTINUE, Dispatch())
    # c passed alone, on a branch b has moved: merged onto b, verified again, then d starts.
    assert verify_step(db, settings, job_id, "c", "c:v") == (Outcome.CONTINUE, Dispatch(("d",)))
    (merged,) = _events(db, job_id, "step_integrated")
    assert merged.step_key == "c"
    assert merged.data["commands"] == ["grep -q C c.txt", "grep -q B b.txt"]
    head = git(repo, "rev-parse", f"merlin/{job_id}")
    assert git(repo, "show", f"{head}:b.txt") == "B"  # the merged tree holds both
    assert git(repo, "show", f"{head}:c.txt") == "C"
    assert git(repo, "rev-parse", f"{head}^") == rows["b"].attempts[0].commit  # one parent
    assert run(db, settings, job_id, "d") == (Outcome.CONTINUE, Dispatch(finalize=True))
    assert step_rows(db, job_id)["d"].attempts[0].start_commit == head  # d starts with b and c
    assert finalize_job(db, settings, job_id) == "completed"
    view = job_view(db, job_id)
    assert [s["depends_on"] for s in view["steps"]] == [[], ["a"], ["a"], ["b", "c"]]
    assert all(s["started_at"] and s["finished_at"] for s in view["steps"])


def test_a_conflict_is_fed_back_and_the_next_attempt_passes(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    steps = [
        step("base", "true"),
        step("b", "grep -q B shared.txt", "base"),
        step("c", "grep -q C shared.txt", "base"),
    ]
    rules = [
        write("base.txt", "base\n", r"Step base \("),
        write("shared.txt", "B\nC\n", r"(?s)Step c \(.*moved the job branch"),
        write("shared.txt", "B\n", r"Step b \("),
        write("shared.txt", "C\n", r"Step c \("),
    ]
    job_id, repo = job(db, settings, tmp_path, steps, rules)
    run(db, settings, job_id, "base")
    assert execute_step(db, settings, job_id, "b", "b:a") is Outcome.CONTINUE
    assert execute_step(db, settings, job_id, "c", "c:a") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "b", "b:v")[0] is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "c", "c:v")[0] is Outcome.RETRY
    failed = step_rows(db, job_id)["c"].attempts[0]
    assert failed.status == "failed"
    assert failed.error.startswith("integration failed: the step's change conflicts")
    assert "shared.txt" in failed.error
    assert "<<<<<<<" in failed.output_tail
    assert "+C" in failed.output_tail
    assert execute_step(db, settings, job_id, "c", "c:a2") is Outcome.CONTINUE
    retry = step_rows(db, job_id)["c"].attempts[1]
    head = git(repo, "rev-parse", f"merlin/{job_id}")
    assert (retry.kind, retry.start_commit) == ("integrate", head)
    assert "moved the job branch" in retry.feedback
    assert "<<<<<<<" in retry.feedback
    assert verify_step(db, settings, job_id, "c", "c:v2")[0] is Outcome.CONTINUE
    assert finalize_job(db, settings, job_id) == "completed"
    final = git(repo, "rev-parse", f"merlin/{job_id}")
    assert git(repo, "show", f"{final}:shared.txt") == "B\nC"  # every step's command passes


def test_a_clean_merge_that_breaks_a_siblings_check_is_retried(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    steps = [
        step("base", "true"),
        step("b", "sh -c 'grep -q B b.txt && test ! -e breaks-b'", "base"),
        step("c", "grep -q C c.txt", "base"),
    ]
    c_first = {
        "match": r"Step c \(",
        "turn": 0,
        "reply": {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "c.txt", "content": "C\n"}},
                {"name": "write_file", "arguments": {"path": "breaks-b", "content": "!\n"}},
            ]
        },
    }
    rules = [
        write("base.txt", "base\n", r"Step base \("),
        write("c.txt", "C\n", r"(?s)Step c \(.*moved the job branch"),
        write("b.txt", "B\n", r"Step b \("),
        c_first,
    ]
    job_id, repo = job(db, settings, tmp_path, steps, rules)
    run(db, settings, job_id, "base")
    assert execute_step(db, settings, job_id, "b", "b:a") is Outcome.CONTINUE
    assert execute_step(db, settings, job_id, "c", "c:a") is Outcome.CONTINUE
    assert verify_step(db, settings, job_id, "b", "b:v")[0] is Outcome.CONTINUE
    before = git(repo, "rev-parse", f"merlin/{job_id}")
    # c's own check passes; merged with b, b's check fails: the branch does not move.
    assert verify_step(db, settings, job_id, "c", "c:v")[0] is Outcome.RETRY
    assert git(repo, "rev-parse", f"merlin/{job_id}") == before
    failed = step_rows(db, job_id)["c"].attempts[0]
    assert failed.error.startswith("integration failed: `sh -c 'grep -q B b.txt && test ! -e")
    assert failed.exit_code == 1
    assert run(db, settings, job_id, "c")[0] is Outcome.CONTINUE
    assert finalize_job(db, settings, job_id) == "completed"
    final = git(repo, "rev-parse", f"merlin/{job_id}")
    assert "breaks-b" not in git(repo, "ls-tree", "--name-only", final)


def test_a_commit_on_the_branch_head_it_started_from_needs_no_ancestry_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.engine import integration
    from tests.conftest import make_repo

    repo = make_repo(tmp_path / "repo", {"a.py": "a = 1\n"})
    start = git(repo, "rev-parse", "HEAD")
    (repo / "a.py").write_text("a = 2\n")
    git(repo, "commit", "-qam", "the step's change")
    commit = git(repo, "rev-parse", "HEAD")

    def never(*args: object) -> tuple[str, object]:
        raise AssertionError("nothing is run again on a commit that goes on as it is")

    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(
        integration,
        "is_ancestor",
        lambda repo, older, newer: asked.append((older, newer)) or True,
    )
    done = integration.integrate(repo, start, commit, ["true"], "m", never, parent=start)
    assert (done.onto, done.commit, done.merged) == (start, commit, False)
    assert asked == []
    # Without the parent, git is asked.
    assert integration.integrate(repo, start, commit, ["true"], "m", never).commit == commit
    assert asked == [(start, commit)]
