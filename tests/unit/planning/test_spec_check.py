"""The spec check: reading the checking model's answer, the policy, and jobs it judges."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.config import MerlinConfig, Specs, Tier
from merlin_flow.planning.spec_check import (
    Policy,
    Violation,
    check_messages,
    parse_answer,
    policy,
    run_check,
)

V = Violation

ANSWERS: list[tuple[str, list[Violation], bool]] = [
    # (answer, violations, unreadable)
    ("PASS", [], False),
    ("pass", [], False),
    ("**PASS**", [], False),
    ("The diff keeps every constraint.\n\nPASS", [], False),
    ("VIOLATION app.py:2: answer() is negative", [V("app.py", 2, "answer() is negative")], False),
    ("VIOLATION: src/a.py:10: raises ValueError", [V("src/a.py", 10, "raises ValueError")], False),
    ("- **VIOLATION** `app.py:3`: wrong error", [V("app.py", 3, "wrong error")], False),
    ("1. VIOLATION app.py:4-6: loop never ends", [V("app.py", 4, "loop never ends")], False),
    ("violation app.py: the API changed", [V("app.py", None, "the API changed")], False),
    ("VIOLATION input is not validated", [V("", None, "input is not validated")], False),
    (
        "I looked at the diff carefully.\nVIOLATION a.py:1: one\nSome prose in between.\n"
        "VIOLATION b.py:2: two\nOtherwise it would PASS.",
        [V("a.py", 1, "one"), V("b.py", 2, "two")],
        False,
    ),
    ("No violations found, the change is fine.", [], True),
    ("", [], True),
    ("```json\n{\"ok\": true}\n```", [], True),
    ("VIOLATION", [], True),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "violations", "unreadable"), ANSWERS)
def test_answers_are_read_leniently(
    answer: str, violations: list[Violation], unreadable: bool
) -> None:
    result = parse_answer(answer)
    assert list(result.violations) == violations
    assert result.passed is (not violations)
    assert (result.note is not None) is unreadable
    if unreadable:
        assert "taken as a pass" in str(result.note)


def test_a_violation_prints_as_the_model_writes_it() -> None:
    assert str(V("app.py", 2, "broken")) == "VIOLATION app.py:2: broken"
    assert str(V("app.py", None, "broken")) == "VIOLATION app.py: broken"
    assert str(V("", None, "broken")) == "VIOLATION broken"


@pytest.mark.parametrize(
    ("check", "flag", "expected"),
    [
        ("off", False, Policy.OFF),
        ("off", True, Policy.ENFORCE),
        ("warn", False, Policy.WARN),
        ("warn", True, Policy.WARN),
        ("enforce", False, Policy.ENFORCE),
        ("enforce", True, Policy.ENFORCE),
    ],
)
def test_policy_of_a_step(check: Any, flag: bool, expected: Policy) -> None:
    config = MerlinConfig(tiers=[Tier(name="t", model="openai/m")], specs=Specs(check=check))
    assert policy(config, flag) is expected


def test_the_check_tier_is_named_or_the_planning_tier() -> None:
    tiers = [Tier(name="a", model="openai/m"), Tier(name="b", model="openai/m")]
    assert MerlinConfig(tiers=tiers).spec_check_tier().name == "a"
    assert MerlinConfig(tiers=tiers, specs=Specs(check_tier="b")).spec_check_tier().name == "b"
    with pytest.raises(ValueError, match=r"specs\.check_tier names unknown tier"):
        MerlinConfig(tiers=tiers, specs=Specs(check_tier="c"))


def test_a_failed_check_call_is_a_note_not_an_error() -> None:
    def failing(*_args: Any) -> Any:
        raise ConnectionRefusedError("no server")

    result = run_check(Tier(name="t", model="openai/m"), "Invariants:\nx", "diff", failing)
    assert result.passed
    assert str(result.note).startswith("spec check could not run: ")


def test_the_diff_is_cut_for_the_prompt() -> None:
    messages = check_messages("Invariants:\nx", "+" * 50_000)
    assert "[... diff cut]" in messages[1]["content"]
    assert len(messages[1]["content"]) < 30_000
