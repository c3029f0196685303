"""A request's job: recorded, planned with journaled calls, approved or rejected."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.config import Tier
from merlin_flow.errors import InputError
from merlin_flow.jobs.decisions import reject_job
from merlin_flow.jobs.requesting import approve_job, plan_job, submit_request
from merlin_flow.jobs.views import job_view, list_jobs
from merlin_flow.models.llm import Completion, complete
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus, LlmCall
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git, make_repo

PLAN = json.dumps(
    {
        "steps": [
            {"id": "core", "step_type": "Feature", "title": "Add Point",
             "instruction": "Add a Point class to geo.py", "estimated_tokens": 1000},
            {"id": "tests", "step_type": "Test", "title": "Test Point",
             "instruction": "Test Point", "depends_on": ["core"]},
        ]
    }
)  # fmt: skip
REQUEST = "Add a Point class to geo.py with distance(), and cover it with tests and docs"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose merlin.toml names a scripted tier that plans ``PLAN``.

    The script is inside the repository: a repository's own file names no other file.
    """
    rules = [{"match": "You plan changes", "turn": 0, "reply": {"content": PLAN}}]
    return make_repo(
        tmp_path / "repo",
        {
            "geo.py": "X = 1\n",
            "pyproject.toml": '[project]\nname = "geo"\nversion = "0"\n',
            "local.yaml": yaml.safe_dump({"rules": rules}),
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n',
            "specs/geo.md": "# Geometry\n\n## Invariants\n\nA Point is immutable.\n",
        },
    )


def _count(db: Database, model: Any) -> int:
    with db.reader() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def _job(db: Database, job_id: str) -> Job:
    with db.reader() as session:
        job = session.get_one(Job, job_id)
        session.expunge(job)
        return job


def test_a_request_is_planned_and_waits_for_approval(
    db: Database, settings: Settings, repo: Path
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    assert made.status == JobStatus.AWAITING_APPROVAL
    job = _job(db, made.job_id)
    assert job.request == REQUEST
    assert [s["id"] for s in job.tasklist["steps"]] == ["core", "tests"]
    assert job.plan is not None
    assert job.plan["answers"] == [PLAN]
    assert job.plan["approved_by"] is None
    assert git(repo, "branch", "--list", job.branch) == ""  # no branch until approved


def test_approval_makes_the_branch_and_the_steps(
    db: Database, settings: Settings, repo: Path
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    approve_job(db, settings, made.job_id, "ada")
    job = _job(db, made.job_id)
    assert job.status == JobStatus.PENDING
    assert job.plan is not None
    assert (job.plan["approved_by"], job.plan["edited"]) == ("ada", False)
    assert git(repo, "rev-parse", job.branch) == job.base_commit
    assert job_view(db, made.job_id)["branch"] == job.branch  # it exists now
    with pytest.raises(InputError, match="only a job awaiting approval can be approved"):
        approve_job(db, settings, made.job_id, "ada")


def test_approval_reads_the_base_commits_files_not_the_work_tree_as_it_is_now(
    db: Database, settings: Settings, repo: Path
) -> None:
    """The work tree moved on after the request (another branch, a Node project there):
    the steps' exit commands are those of the commit the job starts at."""
    made = submit_request(db, settings, REQUEST, str(repo))
    git(repo, "checkout", "-q", "-b", "elsewhere")
    git(repo, "rm", "-q", "pyproject.toml")
    (repo / "package.json").write_text("{}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a Node project now")
    (repo / "go.mod").write_text("module geo\n")  # and an edit not even committed
    approve_job(db, settings, made.job_id, "ada")
    with db.reader() as session:
        steps = session.get_one(Job, made.job_id).steps
        assert [step.exit_command for step in steps] == ["python -m pytest -q"] * 2
    assert not list(settings.worktrees_dir.glob("files-*"))  # the base's files: removed


@contextlib.contextmanager
def _cut_once() -> Iterator[list[str]]:
    """The first flush of any session loses its connection (a database outage)."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    cut: list[str] = []

    def cut_once(session: Session, _context: object) -> None:
        if not cut:
            cut.append("cut")
            raise OperationalError("UPDATE", {}, Exception("server closed the connection"))

    event.listen(Session, "after_flush", cut_once)
    try:
        yield cut
    finally:
        event.remove(Session, "after_flush", cut_once)


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_decision_rides_out_a_database_outage_as_submit_does(
    db: Database,
    settings: Settings,
    repo: Path,
    decision: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from merlin_flow.store import database

    made = submit_request(db, settings, REQUEST, str(repo))
    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    with _cut_once() as cut:
        if decision == "approve":
            approve_job(db, settings, made.job_id, "ada")
        else:
            reject_job(db, made.job_id, "ada")
    assert cut == ["cut"]  # the first try was cut; the second landed
    job = _job(db, made.job_id)
    expected = JobStatus.PENDING if decision == "approve" else JobStatus.REJECTED
    assert job.status == expected
    assert job.plan is not None
    assert job.plan[f"{decision.removesuffix('e')}ed_by"] == "ada"
    branch = git(repo, "branch", "--list", job.branch).strip("* ")
    assert branch == (job.branch if decision == "approve" else "")


def test_an_edited_plan_replaces_the_planned_one(
    db: Database, settings: Settings, repo: Path
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    edited = parse_tasklist(
        {"title": "mine", "steps": [{"id": "only", "step_type": "Feature", "description": "d"}]}
    )
    approve_job(db, settings, made.job_id, "ada", edited)
    job = _job(db, made.job_id)
    assert (job.title, [s["id"] for s in job.tasklist["steps"]]) == ("mine", ["only"])
    assert job.plan is not None
    assert job.plan["edited"] is True


def test_a_rejected_plan_ends_the_job(db: Database, settings: Settings, repo: Path) -> None:
    made = submit_request(db, settings, REQUEST, str(repo))
    assert job_view(db, made.job_id)["branch"] is None  # not before its approval
    reject_job(db, made.job_id, "bob")
    job = _job(db, made.job_id)
    assert (job.status, job.finished_at is not None) == (JobStatus.REJECTED, True)
    assert job_view(db, made.job_id)["branch"] is None  # none was made, and none is named
    assert list_jobs(db)[0]["branch"] is None
    assert git(repo, "branch", "--list", f"merlin/{made.job_id}") == ""
    with pytest.raises(InputError, match="can be rejected"):
        reject_job(db, made.job_id, "bob")


def test_with_approval_given_the_job_is_ready_to_run(
    db: Database, settings: Settings, repo: Path
) -> None:
    made = submit_request(db, settings, REQUEST, str(repo), approved_by="ci")
    assert made.status == JobStatus.PENDING
    assert _job(db, made.job_id).plan["approved_by"] == "ci"  # type: ignore[index]


def test_a_missing_attached_file_is_refused_before_anything_is_written(
    db: Database, settings: Settings, repo: Path
) -> None:
    with pytest.raises(InputError, match=r"@nope\.py"):
        submit_request(db, settings, REQUEST + " like @nope.py", str(repo))
    assert _count(db, Job) == 0


def test_the_relevant_specs_reach_the_planner(db: Database, settings: Settings, repo: Path) -> None:
    asked: list[str] = []

    def spy(tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        asked.append(messages[-1]["content"])
        return complete(tier, messages, tools)

    made = submit_request(db, settings, REQUEST, str(repo), call_model=spy)
    assert "Constraints from the project's specs" in asked[0]
    assert "A Point is immutable." in asked[0]
    plan = _job(db, made.job_id).plan
    assert plan is not None
    assert plan["specs"] == ["specs/geo.md"]  # what the dashboard's plan view lists


def test_planning_cut_off_is_replayed_from_the_journal(
    db: Database, settings: Settings, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after the paid planner call: planning again pays nothing twice."""
    import merlin_flow.jobs.requesting as requesting

    def die(*_args: Any) -> Any:
        raise SystemExit("killed")

    monkeypatch.setattr(requesting, "to_tasklist", die)
    with pytest.raises(SystemExit):
        submit_request(db, settings, REQUEST, str(repo))
    monkeypatch.undo()
    with db.reader() as session:
        job_id = session.scalars(select(Job.id)).one()
        assert session.get_one(Job, job_id).status == JobStatus.PLANNING

    def no_live_call(*_args: Any) -> Completion:
        raise AssertionError("the planner was asked again")

    assert plan_job(db, settings, job_id, no_live_call) == JobStatus.AWAITING_APPROVAL
    with db.reader() as session:
        calls = session.scalars(select(LlmCall).order_by(LlmCall.seq)).all()
        assert [(c.replayed, c.attempt_id, c.run) for c in calls] == [
            (False, None, 1),
            (True, None, 2),
        ]
    assert _job(db, job_id).plan["answers"] == [PLAN]  # type: ignore[index]


def test_of_two_planners_at_once_the_second_writes_nothing(
    db: Database, settings: Settings, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume plans a job its first planner is still planning: one plan is kept."""
    import merlin_flow.jobs.requesting as requesting

    def die(*_args: Any) -> Any:
        raise SystemExit("killed")

    monkeypatch.setattr(requesting, "to_tasklist", die)
    with pytest.raises(SystemExit):
        submit_request(db, settings, REQUEST, str(repo))
    monkeypatch.undo()
    with db.reader() as session:
        job_id = session.scalars(select(Job.id)).one()
    planned = requesting.make_plan

    def meanwhile(*args: Any) -> Any:
        made = planned(*args)
        monkeypatch.setattr(requesting, "make_plan", planned)  # the other planner's own
        assert plan_job(db, settings, job_id) == JobStatus.AWAITING_APPROVAL
        approve_job(db, settings, job_id, approved_by="ada")
        return made

    monkeypatch.setattr(requesting, "make_plan", meanwhile)
    with pytest.raises(InputError, match=f"job {job_id} was planned meanwhile .it is pending."):
        plan_job(db, settings, job_id)
    job = _job(db, job_id)
    assert job.status == JobStatus.PENDING  # approved, not reset to awaiting approval
    assert job.plan["approved_by"] == "ada"  # type: ignore[index]


def test_a_single_action_is_one_step_approved_with_no_model_call(
    db: Database, settings: Settings, repo: Path
) -> None:
    made = submit_request(db, settings, "Rename X in geo.py", str(repo))
    assert made.status == JobStatus.PENDING  # the one step asked for: nothing to review
    job = _job(db, made.job_id)
    assert [s["description"] for s in job.tasklist["steps"]] == ["Rename X in geo.py"]
    assert job.plan is not None
    assert job.plan["approved_by"]
    assert _count(db, LlmCall) == 0


EDITOR = """\
import sys, pathlib
path = pathlib.Path(sys.argv[1])
path.write_text(path.read_text().replace("id: tests", "id: checks"))
"""


def test_the_terminal_review_edits_then_approves(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    monkeypatch.setenv("EDITOR", f"{sys.executable} {editor}")
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("merlin_flow.cli.starting.on_a_terminal", lambda: True)
    monkeypatch.setattr("merlin_flow.cli.starting.run_embedded", lambda *a, **k: None)
    result = CliRunner().invoke(app, ["run", REQUEST, "--repo", str(repo)], input="e\na\n")
    assert result.exit_code == 0, result.output
    assert "est. tokens" in result.output  # the preview came first
    assert "edited plan: 2 step(s)" in result.output
    db = Database(f"sqlite:///{tmp_path / 'home' / 'merlin.db'}")
    try:
        with db.reader() as session:
            job = session.scalars(select(Job)).one()
            assert [s["id"] for s in job.tasklist["steps"]] == ["core", "checks"]
            assert job.status == JobStatus.PENDING
            assert job.plan["edited"] is True
    finally:
        db.dispose()


def test_the_terminal_review_can_reject(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("merlin_flow.cli.starting.on_a_terminal", lambda: True)
    result = CliRunner().invoke(app, ["run", REQUEST, "--repo", str(repo)], input="x\nr\n")
    assert result.exit_code == 1, result.output
    assert "answer a (approve), e (edit) or r (reject)" in result.output
    assert "rejected: nothing ran" in result.output


@pytest.mark.parametrize(
    ("argument", "problem"),
    [("tasklist.yml", "TaskList file not found: tasklist.yml"), ("specs", "is a folder")],
)
def test_a_mistyped_tasklist_path_is_not_taken_for_a_request(
    tmp_path: Path, repo: Path, argument: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo)
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["submit", argument])
    assert result.exit_code == 2
    assert problem in result.output


def test_watching_a_plan_that_awaits_approval_says_so(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    submitted = CliRunner().invoke(app, ["submit", REQUEST, "--repo", str(repo), "--json"])
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.stdout)["job_id"]
    watched = CliRunner().invoke(app, ["watch", job_id])
    assert watched.exit_code == 2
    assert f"`merlin approve {job_id}` starts it" in " ".join(watched.output.split())


def test_resume_plans_a_job_cut_off_while_planning(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import merlin_flow.jobs.requesting as requesting

    monkeypatch.setenv("MERLIN_HOME", str(tmp_path / "home"))
    with monkeypatch.context() as patched:
        patched.setattr(requesting, "to_tasklist", lambda *_: sys.exit(3))  # dies mid-planning
        cut = CliRunner().invoke(app, ["submit", REQUEST, "--repo", str(repo)])
    assert cut.exit_code == 3
    job_id = json.loads(CliRunner().invoke(app, ["list", "--json"]).stdout)[0]["id"]
    resumed = CliRunner().invoke(app, ["resume", job_id, "--json"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout) == {"job_id": job_id, "status": "awaiting_approval"}
