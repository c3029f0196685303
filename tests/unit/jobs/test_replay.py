"""Replays: comparing a replay with its original, the verdict and the reasons given."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.verdict import verify_step
from merlin_flow.errors import InputError
from merlin_flow.jobs.logs import job_logs
from merlin_flow.jobs.replay import ReplayReport, StepComparison, compare, create_replay
from merlin_flow.jobs.requesting import submit_request
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, LlmCall
from tests.conftest import make_repo
from tests.unit.scripted_jobs import scripted_job


def _report(replay_path: str, same_tree: bool, resumes: int = 0) -> ReplayReport:
    step = StepComparison("s0", "execute@local, escalate@premium", replay_path, "a", "b", same_tree)
    status = "completed" if replay_path.endswith("premium") else "failed"
    return ReplayReport("j1", "j2", "completed", status, [step], 3, 3, resumes)


def test_a_reproduction_has_no_differences() -> None:
    report = _report("execute@local, escalate@premium", same_tree=True)
    assert report.reproduced
    assert report.differences == []
    assert report.to_json()["differences"] == []


def test_each_difference_is_named() -> None:
    report = _report("execute@local", same_tree=False, resumes=1)
    assert not report.reproduced
    assert report.differences == [
        "the original completed, the replay failed",
        "step s0: the original's attempts were execute@local, escalate@premium, "
        "the replay's execute@local",
        "the original was resumed 1 time(s) (merlin resume): the replay runs in one go, "
        "without the failure, the wait or the tier chosen at resume",
    ]
    other_files = _report("execute@local, escalate@premium", same_tree=False)
    assert other_files.differences == ["step s0: same attempts, but they ended on other files"]


def _work(db: Database, settings: Settings, job_id: str) -> None:
    """Work a one-step job to its end, as the step, verify and finalize tasks would."""
    for n in range(5):  # its attempts: execute, and any fix or escalation after it
        execute_step(db, settings, job_id, "s0", f"{job_id}:{n}a")
        if verify_step(db, settings, job_id, "s0", f"{job_id}:{n}b")[0] is not Outcome.RETRY:
            break
    finalize_job(db, settings, job_id)


def test_compare_finds_a_replay_that_reproduced_its_original(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    original = scripted_job(db, settings, py_repo, tmp_path)
    _work(db, settings, original)
    replay = create_replay(db, settings, original)
    _work(db, settings, replay)
    report = compare(db, settings, replay)
    assert (report.original, report.replay) == (original, replay)
    assert (report.original_status, report.replay_status) == ("completed", "completed")
    assert report.calls == report.identical_requests == 2
    assert [(s.original_path, s.same_tree) for s in report.steps] == [("execute@local", True)]
    assert report.reproduced
    assert report.differences == []


def test_compare_names_what_a_replay_could_not_reproduce(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    original = scripted_job(db, settings, py_repo, tmp_path)
    _work(db, settings, original)
    with db.session() as session:  # the journal lost the original's last answer
        last = session.scalars(
            select(LlmCall).where(LlmCall.job_id == original).order_by(LlmCall.seq.desc())
        ).first()
        session.delete(last)
    replay = create_replay(db, settings, original)
    _work(db, settings, replay)
    report = compare(db, settings, replay)
    assert report.replay_status == "failed"
    assert not report.reproduced
    assert report.differences[0] == "the original completed, the replay failed"


def _question(db: Database, settings: Settings, tmp_path: Path) -> str:
    """A question answered by a scripted tier: a grep, then the answer."""
    grep = {"tool_calls": [{"name": "grep", "arguments": {"pattern": "return 4"}}]}
    rules = [
        {"match": "You answer questions", "turn": 0, "reply": grep},
        {"match": "You answer questions", "turn": 1, "reply": {"content": "It returns 41."}},
    ]
    repo = make_repo(
        tmp_path / "repo",
        {
            "app.py": "def answer():\n    return 41\n",
            "local.yaml": yaml.safe_dump({"rules": rules}),
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n',
        },
    )
    return submit_request(db, settings, "What does answer() return?", str(repo)).job_id


def test_a_question_is_replayed_from_its_journal(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    original = _question(db, settings, tmp_path)
    (tmp_path / "repo" / "local.yaml").write_text("rules: []\n")  # the script is not asked again
    replay = create_replay(db, settings, original)
    report = compare(db, settings, replay)
    assert (report.original_status, report.replay_status, report.steps) == (
        "completed", "completed", [],
    )  # fmt: skip
    assert report.original_answer == report.replay_answer == "It returns 41."
    assert report.calls == report.identical_requests == 2
    assert report.reproduced
    [entry] = job_logs(db, replay)  # the replay's conversation is shown as the original's
    assert [m["role"] for m in entry["transcript"]] == ["user", "assistant", "tool", "assistant"]


def test_a_question_whose_journal_lost_its_answer_is_not_reproduced(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    original = _question(db, settings, tmp_path)
    with db.session() as session:
        last = session.scalars(
            select(LlmCall).where(LlmCall.job_id == original).order_by(LlmCall.seq.desc())
        ).first()
        session.delete(last)
    report = compare(db, settings, create_replay(db, settings, original))
    assert report.replay_status == "failed"
    assert report.replay_answer is None
    assert report.differences == [
        "the original completed, the replay failed",
        "the replay's answer differs from the original's",
    ]


def test_a_rejected_plan_cannot_be_replayed(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    original = _question(db, settings, tmp_path)
    with db.session() as session:  # as `merlin reject` leaves a plan
        job = session.get_one(Job, original)
        job.status = JobStatus.REJECTED
    with pytest.raises(InputError, match="was rejected: nothing ran"):
        create_replay(db, settings, original)
