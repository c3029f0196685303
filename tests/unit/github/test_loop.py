"""handle() on what needs no job: answers, refusals, reject and cancel, on the fake GitHub.

The loop with jobs (plan, approve, review rounds) is tests/e2e/test_github.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from merlin_flow.errors import InputError, PlanRefused
from merlin_flow.github.api import GitHubApi
from merlin_flow.github.events import Command, Ignore, Reply, Thread, Trigger
from merlin_flow.github.loop import REJECTED, Place, handle
from merlin_flow.github.plan_block import SignedPlan, write_block
from merlin_flow.github.thread import PROGRESS_MARK
from merlin_flow.jobs.views import job_status
from merlin_flow.settings import Settings
from merlin_flow.store import Database, JobStatus
from tests.github_server import FakeGitHub, fake_github
from tests.unit.scripted_jobs import scripted_job

KEY = "k" * 32
THREAD = Thread("acme/shop", 7, "Timeout", "login hangs", is_pull_request=False)


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with fake_github() as github:
        github.add_issue(7, "Timeout", "login hangs")
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
