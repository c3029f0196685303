"""The rules that decide, before any model call, what a request in plain words becomes."""

from __future__ import annotations

import pytest

from merlin_flow.planning.requests import (
    RequestKind,
    classify,
    file_references,
    numbered_items,
    step_type_for,
)
from merlin_flow.planning.routing import Complexity
from merlin_flow.tasklist import StepType

Q, S, P = RequestKind.QUESTION, RequestKind.SINGLE, RequestKind.PLANNED

TABLE: list[tuple[str, RequestKind]] = [
    # Questions: a question mark, or a start that asks.
    ("What is 2+2?", Q),
    ("What does 'create' mean?", Q),
    ("Why does test_login fail on CI?", Q),
    ("why is the cache never invalidated", Q),
    ("How does the retry logic in client.py work?", Q),
    ("how do I run the tests", Q),
    ("Where is the database URL configured?", Q),
    ("where are sessions stored", Q),
    ("Which module parses the config?", Q),
    ("When was the timeout added", Q),
    ("Who calls validate_user?", Q),
    ("Explain the escalation logic in verdict.py", Q),
    ("explain @src/app.py", Q),
    ("Describe the public API of the parser", Q),
    ("Show me where retries are configured", Q),
    ("Tell me about the auth module", Q),
    ("Can you explain how leases expire?", Q),
    ("Could you describe the data model", Q),
    ("Is there a test for divide by zero?", Q),
    ("Does the CLI support --json everywhere?", Q),
    ("Should we drop Python 3.10", Q),
    ("The build is slow on CI, any idea?", Q),
    # Single actions: one short imperative on one thing.
    ("Fix the timeout bug in auth", S),
    ("fix the typo in README.md", S),
    ("Rename get_usr to get_user in users.py", S),
    ("Add a docstring to divide()", S),
    ("Remove the unused import in cli.py", S),
    ("Bump requests to 2.32", S),
    ("Make divide(1, 0) raise ZeroDivisionError", S),
    ("Add a test for the empty list case of mean()", S),
    ("Update the copyright year in LICENSE", S),
    ("Replace print with logging in worker.py", S),
    ("Please fix the failing test in test_api.py", S),
    ("Can you fix the login bug?", S),
    ("Could you add type hints to utils.py?", S),
    ("Delete the deprecated flag --legacy", S),
    ("Sort the imports in models.py", S),
    ("Use pathlib instead of os.path in loader.py", S),
    ("Return 404 when the user does not exist", S),
    ("Handle an empty config file in load_config", S),
    ("Refactor @src/parser.py to remove the global state", S),
    ("Document the --budget option", S),
    # Planned: broad, long, several actions, several lines, no action verb.
    ("Refactor all handlers to the new API", P),
    ("Rename every use of get_usr across the code base", P),
    ("Add a --json flag and update the docs", P),
    ("Fix the crash, then add a regression test", P),
    ("Move the helpers to utils.py; also delete old.py", P),
    ("Create a tic-tac-toe game", P),
    ("Write a CLI tool for the report service", P),
    ("Build a REST API for users with login, sessions and rate limiting", P),
    ("Implement OAuth login with Google and GitHub, then store the refresh tokens", P),
    ("Migrate the project from setup.py to pyproject.toml", P),
    ("Add caching to the HTTP client as well as retries", P),
    ("Fix the bug in the parser\nand add a test for it", P),
    ("The login page is broken", P),
    ("Login is slow for users with many sessions", P),
    ("a new endpoint for exporting reports as CSV", P),
    (
        "We need to support Postgres in addition to SQLite. The connection string comes from "
        "an environment variable, migrations must run on both, the tests must run against "
        "both databases in CI, and the docs should explain how to switch. Keep SQLite the "
        "default so that nothing changes for current users.",
        P,
    ),
    ("1. Add a Point class\n2. Add distance()\n3. Add tests for both", P),
    ("Do this:\n1) parse the file\n2) validate it\n3) write the report\n4) add a CLI flag", P),
    ("- [ ] add logging\n- [ ] add metrics\n- [ ] add tracing", P),
    ("1. Fix the bug\n2. Add a test", P),  # two items: planned, without a skeleton
    ("Improve performance of the search endpoint", P),
]


def test_the_table_is_big_enough_and_covers_every_kind() -> None:
    assert len(TABLE) >= 60
    assert {kind for _, kind in TABLE} == set(RequestKind)


@pytest.mark.parametrize(("request_text", "kind"), TABLE)
def test_each_request_is_classified_by_the_rules(request_text: str, kind: RequestKind) -> None:
    result = classify(request_text)
    assert result.kind is kind, result.reason


def test_building_a_whole_system_is_planned_but_fixing_one_part_of_it_is_not() -> None:
    assert classify("Create a tic-tac-toe game").reason == "it builds a whole game"
    assert classify("Build a REST API for users").reason == "it builds a whole api"
    assert classify("Fix the API timeout").kind is RequestKind.SINGLE


def test_the_reason_says_which_rule_decided() -> None:
    assert classify("Add a --json flag and update the docs").reason == (
        "it joins a second action ('and update')"
    )
    assert classify("Refactor all handlers to the new API").reason == (
        "it names a broad scope ('all')"
    )
    assert classify("The login page is broken").reason == "it does not start with an action verb"
    long = "Fix " + "the very long thing " * 5
    assert classify(long).reason == "it has 21 words (a single action has 12)"


def test_a_numbered_list_of_three_or_more_items_is_the_plans_skeleton() -> None:
    result = classify("Please do:\n1. Add a Point class\n2) Add distance()\n3. Add tests")
    assert result.skeleton == ("Add a Point class", "Add distance()", "Add tests")
    assert result.reason == "a numbered list of 3 items"
    assert result.complexity is Complexity.MEDIUM
    many = "\n".join(f"{n}. item {n}" for n in range(1, 8))
    assert classify(many).complexity is Complexity.COMPLEX
    assert classify("1. one\n2. two").skeleton == ()
    assert numbered_items("no list here 1. not at a line start") == ()


def test_complexity_of_single_long_and_medium_requests() -> None:
    assert classify("Fix the typo in README.md").complexity is Complexity.SIMPLE
    assert classify("What is this?").complexity is Complexity.SIMPLE
    assert classify("Refactor all handlers").complexity is Complexity.MEDIUM
    assert classify("Add things. " * 30).complexity is Complexity.COMPLEX


def test_file_references_are_at_paths_not_email_addresses() -> None:
    text = "refactor @src/app.py and @docs/guide.md (see @README.md), mail bob@example.com"
    assert file_references(text) == ("src/app.py", "docs/guide.md", "README.md")
    assert file_references("@a.py twice: @a.py.") == ("a.py",)
    assert classify("Explain @src/app.py").files == ("src/app.py",)


@pytest.mark.parametrize(
    ("text", "step_type"),
    [
        ("Add tests for the parser bug", StepType.TEST),
        ("Fix the crash on empty input", StepType.DEBUG),
        ("Rename get_usr to get_user", StepType.REFACTOR),
        ("Check that the docs build", StepType.VERIFY),
        ("Add a --json flag", StepType.FEATURE),
    ],
)
def test_step_type_from_the_words(text: str, step_type: StepType) -> None:
    assert step_type_for(text) is step_type
