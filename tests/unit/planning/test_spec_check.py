"""The spec check: reading the checking model's answer, the policy, and jobs it judges."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.config import MerlinConfig, Specs, Tier
from merlin_flow.errors import GitError
from merlin_flow.planning.spec_check import (
    Policy,
    SpecOutcome,
    Violation,
    check_messages,
    parse_answer,
    policy,
    run_check,
    with_citations,
)
from merlin_flow.store.events import EventKind

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


FILES = {"app.py": "def answer():\n    return 41\n", "docs/spec.md": "# Spec\n\nanswer() is 42.\n"}


def _read(path: str) -> str | None:
    return FILES.get(path)


@pytest.mark.parametrize("mode", ["check", "enforce"])
def test_citations_that_hold_leave_the_violations_as_they_are(mode: Any) -> None:
    result = parse_answer("VIOLATION app.py:2: returns 41, docs/spec.md:3 `answer() is 42` says 42")
    checked = with_citations(result, _read, mode)
    assert checked.violations == result.violations
    assert [str(r.citation) for r in checked.citations] == ["app.py:2", "docs/spec.md:3"]
    assert all(r.ok for r in checked.citations)
    assert not checked.unfounded
    assert checked.invalid_citations() == ""


def test_invalid_citations_are_marked_and_only_enforce_fails_the_check() -> None:
    answer = "VIOLATION app.py:9: returns 41\nVIOLATION app.py:2: breaks gone.md:1"
    result = parse_answer(answer)
    marked = (
        "VIOLATION app.py:9: returns 41 [citation invalid: line 9 is past the end (2 lines)]\n"
        "VIOLATION app.py:2: breaks gone.md:1 [citation invalid: no such file]"
    )
    checked = with_citations(result, _read, "check")
    assert checked.text() == marked
    assert not checked.unfounded
    invalid = "app.py:9: line 9 is past the end (2 lines); gone.md:1: no such file"
    assert checked.invalid_citations() == invalid
    warned = SpecOutcome(Policy.WARN, ("docs/spec.md",), checked)
    assert not warned.fails
    assert "do not hold" not in warned.event()[1]
    assert warned.event()[1].endswith(marked)

    enforced = with_citations(result, _read, "enforce")
    assert enforced.text() == marked
    assert enforced.unfounded
    assert not enforced.passed
    outcome = SpecOutcome(Policy.ENFORCE, ("docs/spec.md",), enforced)
    assert outcome.fails
    assert outcome.error().startswith(
        f'spec check: its citations do not hold ([agents] citations = "enforce"): {invalid}\n'
    )
    assert outcome.error().endswith(marked)
    kind, message = outcome.event()
    assert kind is EventKind.SPEC_VIOLATION
    assert f"its citations do not hold: {invalid}" in message
    assert SpecOutcome(Policy.WARN, (), enforced).event()[0] is EventKind.SPEC_WARNING


def test_a_pass_has_no_citations_to_check() -> None:
    checked = with_citations(parse_answer("PASS"), _read, "enforce")
    assert checked.passed
    assert checked.citations == ()


def test_citations_git_cannot_read_leave_the_result_alone() -> None:
    def broken(_path: str) -> str | None:
        raise GitError("git cat-file failed")

    result = parse_answer("VIOLATION app.py:9: returns 41")
    assert with_citations(result, broken, "enforce") == result
