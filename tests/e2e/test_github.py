"""`merlin github` end to end: GitHub's own example payloads (tests/fixtures/github) on a
fake GitHub (tests/github_server.py) and a bare git remote, with scripted models. Each
event runs in a `merlin github` process of its own with a fresh MERLIN_HOME, as each
event gets a fresh runner: only the thread and the remote carry anything over."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.store import Database, upgrade
from tests.conftest import git, make_repo
from tests.e2e.helpers import (
    LOCAL_SCRIPT,
    MERLIN,
    merlin_env,
    start_worker,
    status_json,
    stop_worker,
    wait_for,
    write_job_files,
)
from tests.e2e.test_requests import PLANNER_RULES, REQUEST
from tests.github_server import FIXTURES, FakeGitHub, event_payload, fake_github

pytestmark = pytest.mark.e2e

KEY = "a-plan-key-of-thirty-two-chars.."
REVIEW_RULES = """\
  - match: 'Step [\\w-]+ \\([\\s\\S]*rename LICENSE'
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: NOTICE, content: "see README\\n"}
  - match: 'Step [\\w-]+ \\([\\s\\S]*rename LICENSE'
    reply: {content: "NOTICE written"}
"""


class Runner:
    """Runs `merlin github` for one event, as a workflow run would."""

    def __init__(self, tmp_path: Path, fake: FakeGitHub) -> None:
        self.tmp, self.fake, self.runs = tmp_path, fake, 0
        self.remote = tmp_path / "remote.git"
        source = make_repo(
            tmp_path / "source",
            {
                "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
                "app.py": "def answer():\n    return 41\n",
                "test_app.py": "from app import answer\n\n\ndef test_answer():\n"
                "    assert answer() == 42\n",
            },
        )
        subprocess.run(["git", "clone", "--quiet", "--bare", str(source), str(self.remote)],
                       check=True)  # fmt: skip
        local = LOCAL_SCRIPT.replace("rules:\n", "rules:\n" + PLANNER_RULES + REVIEW_RULES, 1)
        _, self.config = write_job_files(tmp_path / "job", local=local, sleep_seconds=1)

    def event(
        self, name: str, payload: dict[str, Any], *args: str, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `merlin github` for one event to its end; ``extra``: more environment."""
        return self.start(name, payload, *args, **extra).communicate_result()

    def start(self, name: str, payload: dict[str, Any], *args: str, **extra: str) -> Run:
        """Start `merlin github` for one event."""
        self.runs += 1
        run = self.tmp / f"run{self.runs}"
        workspace = run / "workspace"  # actions/checkout: origin is the repository
        subprocess.run(["git", "clone", "--quiet", str(self.remote), str(workspace)], check=True)
        event = run / "event.json"
        event.write_text(json.dumps(payload))
        env = merlin_env(
            run / "home",
            GITHUB_EVENT_NAME=name, GITHUB_EVENT_PATH=str(event),
            GITHUB_REPOSITORY=self.fake.repository, GITHUB_API_URL=self.fake.url,
            GITHUB_WORKSPACE=str(workspace), GITHUB_TOKEN="ghs_fake",
            GITHUB_SERVER_URL="https://github.example", GITHUB_RUN_ID=str(self.runs),
            MERLIN_PLAN_KEY=KEY, **extra,
        )  # fmt: skip
        return Run(subprocess.Popen(
            [*MERLIN, "github", "--config", str(self.config), "--out", str(run / "out"), *args],
            env=env, cwd=run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip


class Run:
    """One `merlin github` process."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def communicate_result(self) -> subprocess.CompletedProcess[str]:
        out, err = self.process.communicate(timeout=300)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)


def payload(name: str, fake: FakeGitHub, **changes: Any) -> dict[str, Any]:
    """A fixture in the fake's repository, with ``changes`` (see ``event_payload``)."""
    return event_payload(name, fake.repository, **changes)


def labelled(fake: FakeGitHub, number: int, body: str, *labels: str) -> dict[str, Any]:
    title = f"issue {number}"
    fake.add_issue(number, title, body, ("merlin", *labels))
    return payload("issues.labeled", fake, label__name="merlin", issue__number=number,
                   issue__title=title, issue__body=body,
                   issue__labels=[{"name": n} for n in ("merlin", *labels)])  # fmt: skip


def comment(fake: FakeGitHub, number: int, body: str, association: str = "OWNER") -> dict[str, Any]:
    return payload("issue_comment.created", fake, issue__number=number, comment__body=body,
                   comment__author_association=association)  # fmt: skip


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with fake_github(FakeGitHub(login=None)) as github:  # GITHUB_TOKEN: github-actions[bot]
        yield github


def test_label_plan_approve_job_branch_and_draft_pull_request(
    tmp_path: Path, fake: FakeGitHub
) -> None:
    runner = Runner(tmp_path, fake)
    planned = runner.event("issues", labelled(fake, 7, REQUEST))
    assert planned.returncode == 0, planned.stderr
    [plan] = fake.thread(7)
    assert plan["body"].startswith("### merlin's plan: ")
    assert "| `fix` | Debug | Fix answer() | - | 4000 |" in plan["body"]
    assert "Reply `/merlin approve` to run it" in plan["body"]
    assert not git(runner.remote, "branch", "--list", "merlin/*")  # nothing run, nothing spent

    approved = runner.event("issue_comment", comment(fake, 7, "/merlin approve"))
    assert approved.returncode == 0, approved.stderr
    _, progress, made = fake.thread(7)
    job = re.search(r"<!-- merlin-progress (\w+) -->", progress["body"])[1]  # type: ignore[index]
    assert f"### merlin job `{job}`: completed (3 of 3 steps passed)" in progress["body"]
    assert "[The workflow run](https://github.example/acme/shop/actions/runs/2)" in progress["body"]
    edits = [c for c in fake.calls if c[0] == "PATCH" and c[1].endswith(f"/{progress['id']}")]
    assert len(edits) >= 3  # one comment, edited at least once per step
    # The branch, pushed; a draft pull request that closes the issue, with the summary.
    branch = f"merlin/7-{job}"
    assert git(runner.remote, "show", f"{branch}:app.py") == "def answer():\n    return 42"
    [pull] = fake.pulls.values()
    assert (pull["head"], pull["base"], pull["draft"]) == (branch, "main", True)
    # Its body: per step, the exit command and its result, the tiers, the cost; the
    # job's cost. All of it is the job's view, as `merlin status --json` shows it.
    view = status_json(merlin_env(tmp_path / "run2" / "home"), job)
    costs = {step["id"]: sum(a["known_cost_usd"] for a in step["attempts"])
             for step in view["steps"]}  # fmt: skip
    assert all(costs.values())
    assert view["unpriced_calls"] == 0
    assert pull["body"] == "\n".join([
        "Closes #7.",
        "",
        f"Made by merlin job `{job}`: {view['title']}, completed (3 of 3 steps passed).",
        "",
        "| step | exit command | result | tiers | attempts | cost |",
        "|---|---|---|---|---|---|",
        f"| `fix` | `python -m pytest -q` | passed (exit code 0) | local | 1 | "
        f"${costs['fix']:.4f} |",
        f"| `slow` | `python -m pytest -q` | passed (exit code 0) | local | 1 | "
        f"${costs['slow']:.4f} |",
        f"| `docs` | `python -m pytest -q` | passed (exit code 0) | local | 1 | "
        f"${costs['docs']:.4f} |",
        "",
        f"**Cost:** ${view['known_cost_usd']:.4f}.",
        "",
    ])  # fmt: skip
    assert view["known_cost_usd"] == pytest.approx(sum(costs.values()))
    assert (
        made["body"]
        == f"Draft pull request: https://github.example/acme/shop/pull/{pull['number']}"
    )
    out = tmp_path / "run2" / "out"
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "merlin.patch", "summary.md"]

    again = runner.event("issue_comment", comment(fake, 7, "/merlin approve"))
    assert again.returncode == 2
    assert "has run already" in fake.thread(7)[-1]["body"]


def test_a_tampered_plan_is_refused(tmp_path: Path, fake: FakeGitHub) -> None:
    runner = Runner(tmp_path, fake)
    assert runner.event("issues", labelled(fake, 7, REQUEST)).returncode == 0
    [plan] = fake.thread(7)
    fake.comments[plan["id"]]["body"] = plan["body"].replace("<!-- merlin-plan v1 ",
                                                             "<!-- merlin-plan v1 A")  # fmt: skip
    refused = runner.event("issue_comment", comment(fake, 7, "/merlin approve"))
    assert refused.returncode == 2
    assert "signature does not hold" in fake.thread(7)[-1]["body"]
    assert not fake.pulls


def test_strangers_bad_commands_forks_and_questions(tmp_path: Path, fake: FakeGitHub) -> None:
    runner = Runner(tmp_path, fake)
    fake.add_issue(8, "a question", "")
    stranger = runner.event("issue_comment", comment(fake, 8, "/merlin approve", "NONE"))
    assert stranger.returncode == 0
    assert [c["body"] for c in fake.thread(8)] == [
        "Thanks @Codertocat. merlin takes commands only from this repository's "
        "collaborators, members and owners; ask one of them to run it."
    ]
    typo = runner.event("issue_comment", comment(fake, 8, "/merlin aprove"))
    assert typo.returncode == 2
    assert fake.thread(8)[-1]["body"].startswith("`/merlin aprove` is not a command")
    fork = payload("pull_request.labeled", fake, label__name="merlin")
    fork["pull_request"]["head"]["repo"]["full_name"] = "stranger/shop"
    fake.pulls[2] = {"number": 2, "title": "t", "body": "", "draft": False,
                     "head": "stranger:changes", "base": "main"}  # fmt: skip
    assert runner.event("pull_request", fork).returncode == 0
    assert "does not work on pull requests from forks" in fake.thread(2)[-1]["body"]
    question = runner.event("issues", labelled(fake, 9, "What does answer() return?"))
    assert question.returncode == 0, question.stderr
    [answer] = fake.thread(9)
    assert answer["body"] == (
        "### merlin's answer\n\nanswer() returns 41: app.py line 2 says `return 41`.\n"
    )
    assert not git(runner.remote, "branch", "--list", "merlin/*")
    push = runner.event("push", json.loads((FIXTURES / "push.json").read_text()))
    assert push.returncode == 2
    assert "not 'push'" in push.stderr


def test_review_rounds_push_to_the_pull_requests_branch_up_to_the_cap(
    tmp_path: Path, fake: FakeGitHub
) -> None:
    runner = Runner(tmp_path, fake)
    earlier = tmp_path / "earlier"  # a round before this one fixed answer()
    subprocess.run(["git", "clone", "--quiet", str(runner.remote), str(earlier)], check=True)
    (earlier / "app.py").write_text("def answer():\n    return 42\n")
    git(earlier, "commit", "--quiet", "-am", "fix answer")
    git(earlier, "push", "--quiet", "origin", "HEAD:refs/heads/merlin/7-old")
    fake.pulls[3] = {"number": 3, "title": "t", "body": "", "draft": True,
                     "head": "merlin/7-old", "base": "main"}  # fmt: skip
    review = payload("pull_request_review_comment.created", fake, pull_request__number=3,
                     comment__body="/merlin rename LICENSE notes into a NOTICE file")  # fmt: skip
    review["pull_request"]["head"]["ref"] = "merlin/7-old"
    review["pull_request"]["head"]["repo"]["full_name"] = fake.repository
    first = runner.event("pull_request_review_comment", review, "--max-rounds", "1")
    assert first.returncode == 0, fake.thread(3)
    assert git(runner.remote, "show", "merlin/7-old:NOTICE") == "see README"
    assert fake.thread(3)[-1]["body"].startswith("Pushed to `merlin/7-old`")
    assert len(fake.pulls) == 1  # the same pull request, no new one
    capped = runner.event("pull_request_review_comment", review, "--max-rounds", "1")
    assert capped.returncode == 0
    assert "rounds of merlin (the cap)" in fake.thread(3)[-1]["body"]


def test_the_teams_workers_run_the_job_and_retry_follows_it_after_the_runner_died(
    tmp_path: Path, fake: FakeGitHub, redis_url: str, postgres_url: str
) -> None:
    """`--submit-to`: the approved plan goes to the team's Redis and Postgres workers, on
    the repository's URL. The runner that follows it is killed; the job goes on, and
    `/merlin retry` on a fresh runner follows it to its end and opens the pull request."""
    runner = Runner(tmp_path, fake)
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    team = {"MERLIN_BROKER_URL": redis_url, "MERLIN_DATABASE_URL": postgres_url}
    workers = [
        start_worker(merlin_env(tmp_path / f"team-{role}", **team), tmp_path / f"{role}.log",
                     "--queues", queues, "--pool", pool)
        for role, queues, pool in (("llm", "llm,control", "threads"),
                                   ("verify", "verify", "prefork"))
    ]  # fmt: skip
    try:
        assert runner.event("issues", labelled(fake, 7, REQUEST)).returncode == 0
        following = runner.start("issue_comment", comment(fake, 7, "/merlin approve"),
                                 "--submit-to", **team)  # fmt: skip
        wait_for(lambda: len(fake.thread(7)) == 2, 60, "the progress comment")
        following.process.kill()  # the runner dies; the job is the team's
        following.process.communicate()
        job = re.search(r"merlin-progress (\w+)", fake.thread(7)[1]["body"])[1]  # type: ignore[index]
        retried = runner.event("issue_comment", comment(fake, 7, "/merlin retry"),
                               "--submit-to", **team)  # fmt: skip
        assert retried.returncode == 0, retried.stderr
    finally:
        for worker in workers:
            stop_worker(worker)
    last_progress = fake.thread(7)[-2]["body"]
    assert f"### merlin job `{job}`: completed (3 of 3 steps passed)" in last_progress
    [pull] = fake.pulls.values()
    assert pull["head"] == f"merlin/7-{job}"
    assert git(runner.remote, "show", f"merlin/7-{job}:app.py") == "def answer():\n    return 42"
    steps_run = re.findall(
        r"Task merlin\.step\[[\w-]+\] succeeded", (tmp_path / "llm.log").read_text()
    )
    assert len(steps_run) >= 3  # the team's worker worked the steps, not the runner
    assert not list(tmp_path.glob("run*/home/worktrees/*"))
    again = runner.event("issue_comment", comment(fake, 7, "/merlin retry"), "--submit-to", **team)
    assert again.returncode == 0
    assert fake.thread(7)[-1]["body"] == f"Job `{job}` completed already."


def test_a_failed_job_says_why_and_keeps_its_branch(tmp_path: Path, fake: FakeGitHub) -> None:
    """A round on a pull request whose tests fail (answer() is still 41 on its branch)."""
    runner = Runner(tmp_path, fake)
    git(runner.remote, "branch", "merlin/7-old", "main")
    fake.pulls[3] = {"number": 3, "title": "t", "body": "", "draft": True,
                     "head": "merlin/7-old", "base": "main"}  # fmt: skip
    review = payload("pull_request_review_comment.created", fake, pull_request__number=3,
                     comment__body="/merlin rename LICENSE notes into a NOTICE file")  # fmt: skip
    review["pull_request"]["head"]["ref"] = "merlin/7-old"
    review["pull_request"]["head"]["repo"]["full_name"] = fake.repository
    failed = runner.event("pull_request_review_comment", review)
    assert failed.returncode == 1
    progress, kept = (c["body"] for c in fake.thread(3))
    job = re.search(r"merlin-progress (\w+)", progress)[1]  # type: ignore[index]
    assert f"`{job}`: failed (0 of 1 steps passed)" in progress
    assert "**Step `request` failed:** `python -m pytest -q` exited with code 1" in progress
    assert "FAILED test_app.py::test_answer - assert 41 == 42" in progress
    assert kept == f"`merlin/3-{job}` holds the failed step's last attempt, to inspect."
    view = status_json(merlin_env(tmp_path / "run1" / "home"), job)  # the runner's own store
    last = [a["commit"] for a in view["steps"][0]["attempts"] if a["commit"]][-1]
    assert git(runner.remote, "rev-parse", f"merlin/3-{job}") == last
    untouched = git(runner.remote, "rev-parse", "main")
    assert git(runner.remote, "rev-parse", "merlin/7-old") == untouched  # the pull request's
    assert len(fake.pulls) == 1  # no pull request for a failed job


def test_strangers_comments_cannot_block_an_approval(tmp_path: Path, fake: FakeGitHub) -> None:
    """Someone copies merlin's plan comment (its signed block holds) and writes a progress
    mark: merlin reads its own comments only, so the approval runs merlin's plan."""
    runner = Runner(tmp_path, fake)
    assert runner.event("issues", labelled(fake, 7, REQUEST)).returncode == 0
    [plan] = fake.thread(7)
    fake.add_comment(7, plan["body"], "mallory")
    fake.add_comment(7, "### merlin job\n\n<!-- merlin-progress 0123456789ab -->", "mallory")
    approved = runner.event("issue_comment", comment(fake, 7, "/merlin approve"))
    assert approved.returncode == 0, approved.stderr
    [pull] = fake.pulls.values()
    assert fake.thread(7)[-1]["body"].startswith("Draft pull request: ")
    assert pull["head"].startswith("merlin/7-")


def test_a_label_on_a_pull_request_pushes_to_its_branch_after_approval(
    tmp_path: Path, fake: FakeGitHub
) -> None:
    runner = Runner(tmp_path, fake)
    git(runner.remote, "branch", "feature", "main")
    fake.pulls[5] = {"number": 5, "title": "Three changes", "body": REQUEST, "draft": False,
                     "head": "feature", "base": "main"}  # fmt: skip
    labelled_pull = payload("pull_request.labeled", fake, label__name="merlin", number=5,
                            pull_request__number=5, pull_request__title="Three changes",
                            pull_request__body=REQUEST,
                            pull_request__labels=[{"name": "merlin"}])  # fmt: skip
    labelled_pull["pull_request"]["head"]["ref"] = "feature"
    labelled_pull["pull_request"]["head"]["repo"]["full_name"] = fake.repository
    planned = runner.event("pull_request", labelled_pull)
    assert planned.returncode == 0, planned.stderr
    [plan] = fake.thread(5)
    assert "Reply `/merlin approve` to run it" in plan["body"]
    assert git(runner.remote, "rev-parse", "feature") == git(runner.remote, "rev-parse", "main")
    approve = comment(fake, 5, "/merlin approve")
    approve["issue"]["pull_request"] = {"url": f"{fake.url}/repos/{fake.repository}/pulls/5"}
    approved = runner.event("issue_comment", approve)
    assert approved.returncode == 0, approved.stderr
    assert fake.thread(5)[-1]["body"].startswith("Pushed to `feature`: ")
    assert git(runner.remote, "show", "feature:app.py") == "def answer():\n    return 42"
    assert git(runner.remote, "show", "main:app.py") == "def answer():\n    return 41"
    assert list(fake.pulls) == [5]  # no new pull request
    assert not git(runner.remote, "branch", "--list", "merlin/*")
