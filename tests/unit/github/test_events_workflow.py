"""The shipped workflow's `if:` (deploy/ci/merlin-github.yml), evaluated on GitHub's own
example payloads: it starts a runner for what read_event acts on, and none for the pull
request events of a fork's branch, whose token is read-only (merlin could not even say
why it refuses)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from merlin_flow.github.events import Reply, Trigger, read_event
from tests.github_server import event_payload

WORKFLOW = Path(__file__).resolve().parents[3] / "deploy" / "ci" / "merlin-github.yml"
CONDITION: str = yaml.safe_load(WORKFLOW.read_text())["jobs"]["merlin"]["if"]


def starts(event: str, payload: dict[str, Any]) -> bool:
    """Whether the job's `if:` lets ``event`` with ``payload`` start a runner.

    The expression's few forms (``==``, ``&&``, ``||``, ``startsWith``, properties of
    ``github``) are read as Python; a missing property is null, as GitHub reads it.
    """
    context = {"event_name": event, "event": payload,
               "repository": payload["repository"]["full_name"]}  # fmt: skip

    def get(path: str) -> Any:
        value: Any = context
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def starts_with(text: Any, prefix: str) -> bool:
        return str(text or "").lower().startswith(prefix.lower())

    python = re.sub(r"\bgithub\.([\w.]+)", r'get("\1")', CONDITION)
    python = python.replace("&&", " and ").replace("||", " or ").replace("startsWith", "sw")
    assert set(re.findall(r"[A-Za-z_]\w*(?=\()", python)) <= {"get", "sw"}  # nothing else
    result = eval(python, {"__builtins__": {}}, {"get": get, "sw": starts_with})
    return bool(result)


def fork(payload: dict[str, Any], repo: dict[str, str] | None) -> dict[str, Any]:
    payload["pull_request"]["head"]["repo"] = repo
    return payload


PULL_EVENTS = [
    ("pull_request", "pull_request.labeled", {"label__name": "merlin"}),
    ("pull_request_review", "pull_request_review.submitted", {"review__body": "/merlin do it"}),
    ("pull_request_review_comment", "pull_request_review_comment.created",
     {"comment__body": "/merlin do it"}),
]  # fmt: skip


@pytest.mark.parametrize(("event", "fixture", "changes"), PULL_EVENTS, ids=lambda x: str(x)[:30])
def test_a_pull_request_event_starts_a_runner_unless_its_branch_is_a_forks(
    event: str, fixture: str, changes: dict[str, str]
) -> None:
    own = event_payload(fixture, **changes)
    assert isinstance(read_event(event, own), Trigger)
    assert starts(event, own)
    for repo in ({"full_name": "stranger/Hello-World"}, None):  # None: the fork was deleted
        foreign = fork(event_payload(fixture, **changes), repo)
        assert isinstance(read_event(event, foreign), Reply)  # merlin would only refuse
        assert not starts(event, foreign)


def test_issues_and_comments_start_a_runner_for_merlin_only() -> None:
    assert starts("issues", event_payload("issues.labeled", label__name="merlin"))
    assert not starts("issues", event_payload("issues.labeled"))  # "bug"
    command = event_payload("issue_comment.created", comment__body="/merlin approve")
    assert starts("issue_comment", command)  # on a pull request too: the event does not tell
    assert not starts("issue_comment", event_payload("issue_comment.created"))
    assert not starts("push", event_payload("push"))
