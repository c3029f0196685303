"""handle() on what needs no job: answers, refusals, reject and cancel, on the fake GitHub.

The loop with jobs (plan, approve, review rounds) is tests/e2e/test_github.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from merlin_flow.errors import InputError, PlanRefused
from merlin_flow.github.api import GitHubApi
from merlin_flow.github.events import Command, Ignore, Reply, Thread, Trigger, fork_refusal
from merlin_flow.github.loop import (
    REJECTED,
    Place,
    _already_run,
    _reported,
    _rounds,
    _thread_plan,
    handle,
)
from merlin_flow.github.plan_block import SignedPlan, write_block
from merlin_flow.github.thread import PROGRESS_MARK
from merlin_flow.jobs.views import job_status
from merlin_flow.settings import Settings
from merlin_flow.store import Database, JobStatus
from tests.github_server import FakeGitHub, fake_github
from tests.unit.scripted_jobs import scripted_job

KEY = "k" * 32
THREAD = Thread("acme/shop", 7, "Timeout", "login hangs", is_pull_request=False)
PLAN = SignedPlan("acme/shop", 7, "r", "title: t\nsteps: []\n", "0" * 40)
FORK = Thread("acme/shop", 2, "t", "b", True, head_ref="changes", head_repository="eve/shop")


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with fake_github() as github:
        github.add_issue(7, "Timeout", "login hangs")
        github.pulls[2] = {"number": 2, "title": "t", "body": "", "draft": False,
                           "head": "eve:changes", "base": "main"}  # fmt: skip
        github.pulls[3] = {"number": 3, "title": "t", "body": "", "draft": False,
                           "head": "main", "base": "release"}  # fmt: skip
        yield github


def place(fake: FakeGitHub, tmp_path: Path, key: str | None = KEY) -> Place:
    api = GitHubApi(fake.repository, "t", fake.url)
    return Place(api=api, workspace=tmp_path, token="t", plan_key=key, out=tmp_path / "out")


def trigger(command: Command) -> Trigger:
    return Trigger(command, THREAD, "octocat")


def test_nothing_is_written_for_an_ignored_event(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    assert handle(Ignore("a bot"), place(fake, tmp_path), db, settings) == 0
    assert fake.calls == []


def test_a_reply_is_posted_with_its_exit_code(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    assert handle(Reply(THREAD, "no body", 2), place(fake, tmp_path), db, settings) == 2
    assert [c["body"] for c in fake.thread(7)] == ["no body"]


def test_approve_without_a_plan_is_answered_and_exits_2(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    with pytest.raises(PlanRefused):
        handle(trigger(Command.APPROVE), place(fake, tmp_path), db, settings)
    assert fake.thread(7)[-1]["body"] == (
        "merlin cannot do that: there is no plan in this thread yet: ask for one with /merlin plan"
    )


def test_a_rejected_plan_cannot_be_approved(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    plan = SignedPlan("acme/shop", 7, "r", "title: t\nsteps: []\n", "0" * 40)
    posted = place(fake, tmp_path).api.post(7, "the plan\n" + write_block(plan, KEY))
    assert handle(trigger(Command.REJECT), place(fake, tmp_path), db, settings) == 0
    assert fake.comments[posted.id]["body"].endswith(f"~~Rejected by @octocat.~~ {REJECTED}\n")
    with pytest.raises(PlanRefused, match="this plan was rejected"):
        handle(trigger(Command.APPROVE), place(fake, tmp_path), db, settings)


def test_a_missing_plan_key_is_said_in_the_thread(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    plan = SignedPlan("acme/shop", 7, "r", "title: t\nsteps: []\n", "0" * 40)
    place(fake, tmp_path).api.post(7, write_block(plan, KEY))
    with pytest.raises(InputError, match="MERLIN_PLAN_KEY is not set"):
        handle(trigger(Command.APPROVE), place(fake, tmp_path, key=None), db, settings)
    assert "add it as a repository secret" in fake.thread(7)[-1]["body"]


def test_cancel_says_how_a_runners_job_stops(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    assert handle(trigger(Command.CANCEL), place(fake, tmp_path), db, settings) == 0
    assert "cancel the workflow run" in fake.thread(7)[-1]["body"]


def test_cancel_cancels_the_teams_job_of_the_thread(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings, py_repo: Path
) -> None:
    job = scripted_job(db, settings, py_repo, tmp_path)
    api = place(fake, tmp_path).api
    api.post(7, "### merlin job ...\n\n" + PROGRESS_MARK.format(job=job))
    team = replace(place(fake, tmp_path), submit_to=True)
    assert handle(trigger(Command.CANCEL), team, db, settings) == 0
    assert fake.thread(7)[-1]["body"] == f"Job `{job}`: cancelled."
    assert job_status(db, job) == JobStatus.CANCELLED
    with pytest.raises(InputError, match="has already ended"):
        handle(trigger(Command.CANCEL), team, db, settings)


def test_a_plan_block_in_someone_elses_comment_is_not_read(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings
) -> None:
    """A copy of merlin's signed block, in a stranger's comment: neither a plan, nor a way
    to make merlin's own plan unreadable (its author is not merlin) or rejected."""
    copied = "the plan\n" + write_block(PLAN, KEY)
    fake.add_comment(7, copied, "mallory")
    with pytest.raises(PlanRefused, match="there is no plan in this thread yet"):
        handle(trigger(Command.APPROVE), place(fake, tmp_path), db, settings)
    posted = place(fake, tmp_path).api.post(7, copied)
    after = fake.add_comment(7, copied, "mallory")
    assert _thread_plan(THREAD, place(fake, tmp_path)) == (PLAN, posted)
    assert handle(trigger(Command.REJECT), place(fake, tmp_path), db, settings) == 0
    assert REJECTED in fake.comments[posted.id]["body"]
    assert fake.comments[after]["body"] == copied


def test_progress_marks_and_ends_in_someone_elses_comments_are_not_read(
    fake: FakeGitHub, tmp_path: Path
) -> None:
    """Nor can a stranger's marks make a plan "run already", use up the rounds of a pull
    request, or say a job's end was reported."""
    where = place(fake, tmp_path)
    plan = where.api.post(7, write_block(PLAN, KEY))
    for job in ("aaa", "bbb", "ccc"):
        fake.add_comment(7, PROGRESS_MARK.format(job=job), "mallory")
    fake.add_comment(7, "Draft pull request: https://x/pull/9 `merlin/7-aaa`", "mallory")
    assert not _already_run(THREAD, where, plan)
    assert _rounds(THREAD, where) == 0
    where.api.post(7, PROGRESS_MARK.format(job="aaa"))
    fake.add_comment(7, "Pushed to `x`", "mallory")
    assert _already_run(THREAD, where, plan)
    assert _rounds(THREAD, where) == 1
    assert not _reported(THREAD, where, "aaa")
    where.api.post(7, "Draft pull request: https://x/pull/9")
    assert _reported(THREAD, where, "aaa")


def test_cancel_follows_merlins_progress_comment_not_a_strangers(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings, py_repo: Path
) -> None:
    ours = scripted_job(db, settings, py_repo, tmp_path)
    (tmp_path / "b").mkdir()
    theirs = scripted_job(db, settings, py_repo, tmp_path / "b")
    place(fake, tmp_path).api.post(7, PROGRESS_MARK.format(job=ours))
    fake.add_comment(7, PROGRESS_MARK.format(job=theirs), "mallory")
    team = replace(place(fake, tmp_path), submit_to=True)
    assert handle(trigger(Command.CANCEL), team, db, settings) == 0
    assert fake.thread(7)[-1]["body"] == f"Job `{ours}`: cancelled."
    assert (job_status(db, ours), job_status(db, theirs)) == (
        JobStatus.CANCELLED,
        JobStatus.PENDING,
    )


@pytest.mark.parametrize("command", [Command.REQUEST, Command.PLAN, Command.APPROVE])
def test_a_pull_request_from_the_default_branch_is_refused(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings, command: Command
) -> None:
    """Its branch is the default branch: a round would push there. Nothing is fetched
    (the workspace is no checkout: any git command would fail)."""
    thread = Thread("acme/shop", 3, "t", "b", True, head_ref="main", head_repository="acme/shop")
    asked = Trigger(command, thread, "octocat", text="rename it" if command == "request" else "")
    assert handle(asked, place(fake, tmp_path), db, settings) == 0
    assert [c["body"] for c in fake.thread(3)] == [
        "merlin does not work on this pull request: its branch is `main`, the repository's "
        "default branch, and merlin never pushes to the default branch. Open the pull "
        "request from another branch and ask again."
    ]
    commented = replace(asked, thread=replace(thread, head_ref=None, head_repository=None))
    assert handle(commented, place(fake, tmp_path), db, settings) == 0  # issue_comment: asked
    assert len(fake.thread(3)) == 2


def test_a_forks_refusal_the_token_may_not_post_is_said_on_stderr_and_exits_0(
    fake: FakeGitHub, tmp_path: Path, db: Database, settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake.writable = False  # GitHub gives a fork's pull request events a read-only token
    assert handle(fork_refusal(FORK), place(fake, tmp_path), db, settings) == 0
    assert fake.thread(2) == []
    said = capsys.readouterr().err
    assert said.startswith("merlin github: said nothing in #2: the token may not comment")
    assert "(HTTP 403" in said
    assert "merlin does not work on pull requests from forks (eve/shop)" in said
    on_issue = Trigger(Command.APPROVE, replace(FORK, head_ref=None, head_repository=None), "o")
    assert handle(on_issue, place(fake, tmp_path), db, settings) == 0  # read from the API
    assert "forks (eve/shop)" in capsys.readouterr().err
    fake.writable = True
    assert handle(fork_refusal(FORK), place(fake, tmp_path), db, settings) == 0
    assert "does not work on pull requests from forks" in fake.thread(2)[-1]["body"]
    assert capsys.readouterr().err == ""
