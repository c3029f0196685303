"""GitHubApi through PyGithub against the fake GitHub (tests/github_server.py), over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from merlin_flow.errors import GitHubError
from merlin_flow.github.api import ACTIONS_BOT, GitHubApi
from tests.github_server import FakeGitHub, fake_github


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    with fake_github() as github:
        github.add_issue(7, "Timeout in auth", "login hangs after 30 s")
        yield github


def api(fake: FakeGitHub) -> GitHubApi:
    return GitHubApi(fake.repository, "ghs_test", fake.url)


def test_a_comment_is_posted_then_edited_in_place(fake: FakeGitHub) -> None:
    client = api(fake)
    posted = client.post(7, "planning...")
    assert posted.author == "merlin-bot"
    client.edit(7, posted.id, "step 1 of 2 passed")
    assert [(c.id, c.author, c.body) for c in client.comments(7)] == [
        (posted.id, "merlin-bot", "step 1 of 2 passed")
    ]
    writes = [(method, path) for method, path, _ in fake.calls if method != "GET"]
    assert writes == [
        ("POST", "/repos/acme/shop/issues/7/comments"),
        ("PATCH", f"/repos/acme/shop/issues/comments/{posted.id}"),
    ]


def test_identity_is_the_tokens_login_or_the_actions_bot(fake: FakeGitHub) -> None:
    assert api(fake).identity() == "merlin-bot"
    fake.login = None  # GITHUB_TOKEN may not ask GET /user
    assert api(fake).identity() == ACTIONS_BOT


def test_a_draft_pull_request_is_opened_and_read_back(fake: FakeGitHub) -> None:
    pull = api(fake).open_draft("Fix the timeout", "Closes #7", "merlin/7-abc", "main")
    assert (pull.number, pull.head_ref, pull.base_ref) == (8, "merlin/7-abc", "main")
    assert pull.head_repository == "acme/shop"
    assert fake.pulls[8]["draft"] is True
    assert api(fake).default_branch() == "main"


def test_a_refusal_names_the_call_and_githubs_answer(fake: FakeGitHub) -> None:
    fake.writable = False
    with pytest.raises(GitHubError) as refused:
        api(fake).post(7, "hello")
    assert str(refused.value) == (
        "GitHub refused to comment on #7: HTTP 403 Resource not accessible by integration"
    )
    with pytest.raises(GitHubError, match="list the comments of #99: HTTP 404"):
        api(fake).comments(99)


def test_own_comments_are_those_of_the_tokens_identity_asked_once(fake: FakeGitHub) -> None:
    client = api(fake)
    fake.add_comment(7, "<!-- merlin-progress abc -->", "mallory")
    mine = client.post(7, "the plan")
    fake.add_comment(7, "/merlin approve", "octocat")
    assert [(c.author, c.body) for c in client.own_comments(7)] == [("merlin-bot", "the plan")]
    assert [c.id for c in client.own_comments(7)] == [mine.id]
    assert len(client.comments(7)) == 3
    assert [path for _, path, _ in fake.calls].count("/user") == 1
    fake.login = None  # GITHUB_TOKEN: its comments are github-actions[bot]'s
    actions = api(fake)
    posted = actions.post(7, "progress")
    assert [c.id for c in actions.own_comments(7)] == [posted.id]


def test_a_comment_the_token_may_not_write_is_none_and_other_failures_raise(
    fake: FakeGitHub,
) -> None:
    assert api(fake).post_if_allowed(7, "hello") is not None
    fake.writable = False  # a read-only token, as a fork's pull request events get
    assert api(fake).post_if_allowed(7, "refused") is None
    assert [c["body"] for c in fake.thread(7)] == ["hello"]
    fake.writable = True
    with pytest.raises(GitHubError, match="comment on #99: HTTP 404"):
        api(fake).post_if_allowed(99, "nowhere")
