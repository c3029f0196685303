"""read_event on GitHub's own example payloads (tests/fixtures/github, from octokit/webhooks),
changed only where a test says so."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.errors import InputError
from merlin_flow.github.events import (
    Command,
    Ignore,
    Options,
    Reply,
    Trigger,
    fork_refusal,
    read_event,
)
from tests.github_server import event_payload as payload

MULTILINE = "rename the handlers\nto the new API"


def labelled_issue(**changes: Any) -> dict[str, Any]:
    return payload("issues.labeled", label__name="merlin", **changes)


def test_the_label_plans_the_issue() -> None:
    outcome = read_event("issues", labelled_issue())
    assert isinstance(outcome, Trigger)
    assert outcome.command is Command.PLAN
    assert outcome.author == "Codertocat"
    thread = outcome.thread
    assert (thread.repository, thread.number) == ("Codertocat/Hello-World", 1)
    assert thread.title == "Spelling error in the README file"
    assert thread.body.startswith("It looks like you accidently spelled")
    assert not thread.is_pull_request


def test_another_label_or_action_is_ignored() -> None:
    assert isinstance(read_event("issues", payload("issues.labeled")), Ignore)  # "bug"
    opened = payload("issues.opened.with-empty-body")
    assert read_event("issues", opened) == Ignore("issues opened: only a label starts merlin")
    assert isinstance(read_event("issues", labelled_issue(), Options(label="ai")), Ignore)


def test_an_issue_with_no_body_gets_an_answer_and_exit_code_2() -> None:
    outcome = read_event("issues", labelled_issue(issue__body=None))
    assert isinstance(outcome, Reply)
    assert outcome.exit_code == 2
    assert "no description" in outcome.text
    assert "label it `merlin` again" in outcome.text


def test_a_bot_is_never_obeyed() -> None:
    bot = {"login": "dependabot[bot]", "type": "Bot"}
    assert isinstance(read_event("issues", labelled_issue(sender=bot)), Ignore)
    comment = payload("issue_comment.created", comment__body="/merlin plan")
    comment["comment"]["user"] = {"login": "merlin-app[bot]", "type": "Bot"}
    assert isinstance(read_event("issue_comment", comment), Ignore)


@pytest.mark.parametrize(
    ("body", "command", "text"),
    [
        ("/merlin plan", Command.PLAN, ""),
        ("/merlin approve", Command.APPROVE, ""),
        ("/merlin Approve\nthanks!", Command.APPROVE, ""),
        ("/merlin reject", Command.REJECT, ""),
        ("/merlin retry", Command.RETRY, ""),
        ("/merlin cancel", Command.CANCEL, ""),
        ("/merlin fix the timeout in auth", Command.REQUEST, "fix the timeout in auth"),
        ("/merlin\n" + MULTILINE, Command.REQUEST, MULTILINE),
    ],
)
def test_commands(body: str, command: Command, text: str) -> None:
    outcome = read_event("issue_comment", payload("issue_comment.created", comment__body=body))
    assert isinstance(outcome, Trigger)
    assert (outcome.command, outcome.text) == (command, text)
    assert outcome.comment_id == 492700400


def test_a_comment_that_is_no_command_is_ignored() -> None:
    outcome = read_event("issue_comment", payload("issue_comment.created"))
    assert outcome == Ignore("the comment is not a /merlin command")
    merlinish = payload("issue_comment.created", comment__body="/merlinize this")
    assert isinstance(read_event("issue_comment", merlinish), Ignore)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("/merlin aprove", "`/merlin aprove` is not a command merlin knows."),
        ("/merlin", "`/merlin` is not a command merlin knows."),
    ],
)
def test_an_unknown_command_is_answered_with_the_commands(body: str, problem: str) -> None:
    outcome = read_event("issue_comment", payload("issue_comment.created", comment__body=body))
    assert isinstance(outcome, Reply)
    assert outcome.exit_code == 2
    assert outcome.text.startswith(problem)
    assert "`/merlin approve`" in outcome.text


def test_a_stranger_gets_one_polite_reply() -> None:
    stranger = payload(
        "issue_comment.created", comment__body="/merlin approve", comment__author_association="NONE"
    )
    outcome = read_event("issue_comment", stranger)
    assert isinstance(outcome, Reply)
    assert outcome.exit_code == 0
    assert outcome.text == (
        "Thanks @Codertocat. merlin takes commands only from this repository's "
        "collaborators, members and owners; ask one of them to run it."
    )
    contributor = Options(trusted=frozenset({"OWNER", "CONTRIBUTOR"}))
    stranger["comment"]["author_association"] = "CONTRIBUTOR"
    assert isinstance(read_event("issue_comment", stranger, contributor), Trigger)


def test_a_review_comment_asks_for_a_change_on_its_lines() -> None:
    review = payload(
        "pull_request_review_comment.created",
        comment__body="/merlin use a constant here",
        comment__start_line=260,
    )
    outcome = read_event("pull_request_review_comment", review)
    assert isinstance(outcome, Trigger)
    assert (outcome.command, outcome.text) == (Command.REQUEST, "use a constant here")
    assert (outcome.path, outcome.lines) == ("README.md", (260, 265))
    thread = outcome.thread
    assert (thread.is_pull_request, thread.head_ref, thread.from_fork) == (True, "changes", False)


def test_a_review_body_is_a_command_and_an_empty_review_is_not() -> None:
    empty = payload("pull_request_review.submitted")  # its body is null
    assert isinstance(read_event("pull_request_review", empty), Ignore)
    asked = payload("pull_request_review.submitted", review__body="/merlin split this function")
    outcome = read_event("pull_request_review", asked)
    assert isinstance(outcome, Trigger)
    assert (outcome.text, outcome.path, outcome.lines) == ("split this function", None, None)


def test_a_pull_request_from_a_fork_is_refused_with_the_reason() -> None:
    fork = payload("pull_request.labeled", label__name="merlin")
    fork["pull_request"]["head"]["repo"]["full_name"] = "stranger/Hello-World"
    outcome = read_event("pull_request", fork)
    assert isinstance(outcome, Reply)
    assert "forks (stranger/Hello-World)" in outcome.text
    assert "secrets" in outcome.text
    review = payload("pull_request_review_comment.created", comment__body="/merlin do it")
    review["pull_request"]["head"]["repo"] = None  # the fork was deleted
    refused = read_event("pull_request_review_comment", review)
    assert isinstance(refused, Reply)
    assert refused == fork_refusal(refused.thread)


def test_a_labelled_pull_request_of_this_repository_is_planned() -> None:
    outcome = read_event("pull_request", payload("pull_request.labeled", label__name="merlin"))
    assert isinstance(outcome, Trigger)
    assert outcome.thread.is_pull_request
    assert outcome.thread.head_ref == "changes"


def test_an_event_merlin_does_not_handle_is_an_input_error() -> None:
    with pytest.raises(InputError, match="not 'push'"):
        read_event("push", payload("push"))


def test_a_payload_missing_what_github_sends_is_an_input_error() -> None:
    broken = labelled_issue()
    del broken["repository"]
    with pytest.raises(InputError, match="issues event payload is not one GitHub sends"):
        read_event("issues", broken)
