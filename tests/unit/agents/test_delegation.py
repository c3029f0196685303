"""Autodelegation: the starter agents are picked for their steps; weak matches score low."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from merlin_flow.agents.definitions import AgentDefinition, AgentScope, load_agents
from merlin_flow.agents.delegation import delegate, ranked, stem, terms
from merlin_flow.tool_config import AgentSettings

MIN_SCORE = AgentSettings().min_score


def make(name: str, description: str) -> AgentDefinition:
    return AgentDefinition(
        name, description, "prompt", None, None, None, None, AgentScope.USER, f"{name}.md"
    )


@pytest.fixture(scope="module")
def starters(tmp_path_factory: pytest.TempPathFactory) -> list[AgentDefinition]:
    home: Path = tmp_path_factory.mktemp("merlin-home")
    return list(load_agents(None, home).agents.values())


@pytest.mark.parametrize(
    ("text", "agent"),
    [
        ("write tests for the parser", "test-writer"),
        ("Test: write tests for the parser", "test-writer"),
        ("refactor the handlers to the new API", "refactorer"),
        ("Refactor: refactoring the handlers to the new API", "refactorer"),
        ("review the diff for security problems", "reviewer"),
        ("Verify: the migration applies cleanly", "reviewer"),
        ("document the CLI in the README", "docs-writer"),
        ("Feature: documentation for the --json flag", "docs-writer"),
    ],
)
def test_the_starter_agents_are_picked_for_their_steps(
    starters: list[AgentDefinition], text: str, agent: str
) -> None:
    picked = delegate(text, starters)
    assert picked is not None
    assert picked.agent.name == agent
    assert picked.score >= MIN_SCORE
    others = [d.score for d in ranked(text, starters) if d.agent.name != agent]
    assert max(others) < MIN_SCORE  # not a close call: no other starter qualifies


@pytest.mark.parametrize(
    "text",
    [
        "fix the off-by-one error in the date parser",
        "Debug: the login form crashes on empty passwords",
        "write the code in the files and run it",  # only stop words: write, code, file, run
        "",
    ],
)
def test_steps_no_starter_fits_are_not_delegated(
    starters: list[AgentDefinition], text: str
) -> None:
    assert delegate(text, starters) is None
    assert all(d.score == 0 for d in ranked(text, starters))


def test_a_word_most_agents_share_scores_below_the_threshold() -> None:
    agents = [
        make("alpha", "database schema work"),
        make("beta", "database query tuning"),
        make("gamma", "database backups"),
        make("delta", "frontend styling"),
    ]
    picked = delegate("look at the database", agents)
    assert picked is not None
    assert picked.agent.name == "alpha"  # a tie, broken by name
    assert picked.terms == ("databas",)
    expected = 1 - math.exp(-math.log(4 / 3) / math.log(4))
    assert picked.score == pytest.approx(expected, abs=1e-4)
    assert picked.score < MIN_SCORE


def test_scores_grow_with_each_distinctive_shared_word() -> None:
    agents = [make("schema", "database schema migrations"), make("styles", "frontend styling")]
    one = delegate("touch the schema", agents)
    two = delegate("touch the schema migrations", agents)
    three = delegate("database schema migrations", agents)
    assert one is not None
    assert two is not None
    assert three is not None
    assert (one.score, two.score, three.score) == (0.6321, 0.8647, 0.9502)


def test_a_word_every_agent_has_counts_nothing_but_one_agent_counts_fully() -> None:
    both = [make("a", "database schema"), make("b", "database backups")]
    assert delegate("the database", both) is None
    alone = delegate("the database", [make("a", "database schema")])
    assert alone is not None
    assert alone.score == 0.6321


def test_the_order_of_the_agents_changes_nothing(starters: list[AgentDefinition]) -> None:
    text = "review the docs and the tests"
    forward = [(d.agent.name, d.score) for d in ranked(text, starters)]
    backward = [(d.agent.name, d.score) for d in ranked(text, reversed(starters))]
    assert forward == backward
    assert len(forward) == 4
    assert [score for _, score in forward] == sorted((s for _, s in forward), reverse=True)
    assert all(0 <= score <= 1 for _, score in forward)


def test_no_agents_no_delegation() -> None:
    assert delegate("write tests", []) is None
    assert ranked("write tests", []) == []


@pytest.mark.parametrize(
    "family",
    [
        ("test", "tests", "testing", "tested", "tester"),
        ("write", "writes", "writer", "writing", "written", "wrote"),
        ("refactor", "refactors", "refactoring", "refactored", "refactorer"),
        ("doc", "docs", "document", "documents", "documented", "documentation"),
        ("review", "reviews", "reviewer", "reviewing"),
        ("parse", "parser", "parses", "parsing", "parsed"),
        ("run", "runs", "running"),
        ("library", "libraries"),
        ("class", "classes"),
        ("install", "installing"),
        ("diff", "diffs"),
        ("api", "apis"),
    ],
)
def test_stemming_joins_a_family(family: tuple[str, ...]) -> None:
    assert {stem(word) for word in family} == {stem(family[0])}


@pytest.mark.parametrize(("one", "other"), [("test", "text"), ("parser", "paper"), ("doc", "dog")])
def test_stemming_keeps_different_words_apart(one: str, other: str) -> None:
    assert stem(one) != stem(other)


def test_terms_drop_stop_words_numbers_and_single_letters() -> None:
    assert terms("Add 2 new tests to the code in file x, then run them") == {"test"}
    assert terms("Writer writes; coders coding files") == set()
