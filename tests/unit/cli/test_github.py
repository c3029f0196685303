"""`merlin github`'s bad input: exit code 2 with what is missing, before any call is made;
and a fork's refusal that its read-only token may not post: exit code 0, said on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from tests.github_server import FakeGitHub, event_payload, fake_github

ACTIONS = ("GITHUB_EVENT_NAME", "GITHUB_EVENT_PATH", "GITHUB_REPOSITORY", "GITHUB_WORKSPACE")


@pytest.fixture
def actions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, merlin_home: Path) -> Path:
    event = tmp_path / "event.json"
    event.write_text('{"action": "created"}')
    for name, value in zip(
        ACTIONS, ("issues", str(event), "acme/shop", str(tmp_path)), strict=True
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_x")
    monkeypatch.setenv("GITHUB_API_URL", "http://127.0.0.1:9")  # nothing must be asked
    return event


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["github", *args])
    return result.exit_code, " ".join(result.output.split())


def test_outside_github_actions_it_says_which_variables_are_missing(
    actions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GITHUB_EVENT_PATH")
    monkeypatch.delenv("GITHUB_WORKSPACE")
    code, output = run()
    assert code == 2
    assert "GITHUB_EVENT_PATH, GITHUB_WORKSPACE not set" in output


def test_no_token(actions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_TOKEN")
    assert run() == (2, "error: no token: set GITHUB_TOKEN (or MERLIN_GITHUB_TOKEN) for the step")


def test_an_unreadable_payload_or_another_event(
    actions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actions.write_text("{not json")
    code, output = run()
    assert code == 2
    assert f"cannot read the event payload {actions}" in output
    actions.write_text("{}")
    monkeypatch.setenv("GITHUB_EVENT_NAME", "workflow_dispatch")
    code, output = run()
    assert code == 2
    assert "not 'workflow_dispatch'" in output


def test_an_event_with_nothing_to_do_exits_0_without_a_call(actions: Path) -> None:
    actions.write_text('{"action": "opened", "sender": {"login": "a", "type": "User"}}')
    code, output = run()
    assert code == 0
    assert "merlin github: nothing to do (issues opened: only a label starts merlin)" in output


def test_a_forks_refusal_the_token_may_not_post_exits_0_with_a_line_on_stderr(
    actions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fork = event_payload("pull_request.labeled", "acme/shop", label__name="merlin")
    fork["pull_request"]["head"]["repo"]["full_name"] = "stranger/shop"
    actions.write_text(json.dumps(fork))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    with fake_github(FakeGitHub(writable=False)) as fake:  # a fork's events: read-only
        monkeypatch.setenv("GITHUB_API_URL", fake.url)
        code, output = run()
        assert fake.thread(2) == []
        assert [(method, path) for method, path, _ in fake.calls] == [
            ("POST", "/repos/acme/shop/issues/2/comments")
        ]
    assert code == 0
    assert "merlin github: said nothing in #2: the token may not comment there (HTTP 403" in output
    assert "merlin does not work on pull requests from forks (stranger/shop)" in output
