"""decide: what a failure leads to (retry the call, fix, escalate, fail, stop)."""

from __future__ import annotations

from typing import Any

import pytest

from merlin_flow.config import Limits
from merlin_flow.engine.feedback import failure_reason
from merlin_flow.failures import Action, AttemptKind, Decision, Failure, FailureKind, decide
from merlin_flow.store import Attempt, Step
from tests.unit.attempts import attempt

E, F, X = AttemptKind.EXECUTE, AttemptKind.FIX, AttemptKind.ESCALATE


def history(*kinds: AttemptKind) -> list[Any]:
    return [attempt(n, kind) for n, kind in enumerate(kinds, start=1)]


REASON = "`python -m pytest -q` exited with code 1"


def NextAttempt(kind: AttemptKind, tier_index: int, reason: str) -> Decision:
    action = Action.FIX if kind is AttemptKind.FIX else Action.ESCALATE
    return Decision(action, tier_index, reason)


def after_attempts(
    attempts: list[Any], tier_index: int, tier_count: int, fixes: int, reason: str = REASON
) -> Decision:
    return decide(
        Failure(FailureKind.CAPABILITY, reason),
        attempts=attempts,
        tier_index=tier_index,
        next_tier=tier_index + 1 if tier_index + 1 < tier_count else None,
        limits=Limits(fix_attempts=fixes),
    )


# (attempt kinds so far, tier index, tier count, fix_attempts) -> expected next attempt
CASES = [
    pytest.param((E,), 0, 3, 1, NextAttempt(F, 0, REASON), id="execute fails -> fix same tier"),
    pytest.param((E, F), 0, 3, 1, NextAttempt(X, 1, REASON), id="execute+fix fail -> escalate"),
    pytest.param((E,), 0, 3, 0, NextAttempt(X, 1, REASON), id="no fixes -> escalate directly"),
    pytest.param((E, F), 2, 3, 1, None, id="last tier after fixes -> give up"),
    pytest.param((E,), 0, 1, 0, None, id="single tier, no fixes -> give up"),
    pytest.param(
        (E, F, X), 1, 3, 1, NextAttempt(F, 1, REASON), id="escalate fails -> fix new tier"
    ),
    pytest.param((E, F, X, F), 1, 3, 1, NextAttempt(X, 2, REASON), id="fix on new tier -> next"),
    pytest.param((E, F, X, F), 2, 3, 1, None, id="fixed on last tier -> give up"),
    pytest.param((E, F), 0, 3, 2, NextAttempt(F, 0, REASON), id="two fixes allowed -> fix again"),
    pytest.param((E, F, F), 0, 3, 2, NextAttempt(X, 1, REASON), id="two fixes used -> escalate"),
    pytest.param((E, X), 1, 3, 0, NextAttempt(X, 2, REASON), id="escalate without fixes"),
]


@pytest.mark.parametrize(("kinds", "tier_index", "tier_count", "fixes", "expected"), CASES)
def test_decide(
    kinds: tuple[AttemptKind, ...],
    tier_index: int,
    tier_count: int,
    fixes: int,
    expected: Decision | None,
) -> None:
    result = after_attempts(history(*kinds), tier_index, tier_count, fixes)
    if expected is None:
        assert result == Decision(Action.FAIL_STEP, tier_index, REASON)
    else:
        assert result == expected


def test_decide_with_real_attempt_rows() -> None:
    rows = [
        Attempt(number=1, kind="execute", tier="local", status="failed", exit_code=2),
        Attempt(number=2, kind="fix", tier="local", status="error", error="turn limit"),
    ]
    step = Step(key="s", exit_command="make check")
    step.attempts.extend(rows)
    first = failure_reason(rows[0])
    assert after_attempts(rows[:1], 0, 2, 1, first) == NextAttempt(F, 0, first)
    assert after_attempts(rows, 0, 2, 1, failure_reason(rows[1])) == NextAttempt(X, 1, "turn limit")


# --- failed model calls ------------------------------------------------------------------


def test_transient_call_failures_back_off_then_end_the_attempt() -> None:
    limits = Limits(max_retry_attempts=3, retry_base_delay=0.5)
    failure = Failure(FailureKind.TRANSIENT, "429")
    decisions = [
        decide(failure, tier_index=1, next_tier=2, limits=limits, call_retries=n) for n in range(4)
    ]
    assert [d.action for d in decisions] == [Action.RETRY_CALL] * 3 + [Action.END_ATTEMPT]
    assert [d.delay for d in decisions[:3]] == [0.5, 1.0, 2.0]
    assert all(d.tier_index == 1 for d in decisions)  # retried on the same tier


def test_capability_call_failures_are_not_retried() -> None:
    failure = Failure(FailureKind.CAPABILITY, "no rule fits")
    decision = decide(failure, tier_index=0, next_tier=1, limits=Limits(), call_retries=0)
    assert decision.action is Action.END_ATTEMPT


def test_budget_stops_the_job_whatever_else_holds() -> None:
    failure = Failure(FailureKind.BUDGET, "budget spent")
    for retries in (None, 0):
        decision = decide(failure, tier_index=0, next_tier=1, limits=Limits(), call_retries=retries)
        assert decision.action is Action.STOP_JOB


def test_access_failures_are_never_retried_nor_fixed() -> None:
    failure = Failure(FailureKind.ACCESS, "AuthenticationError: no key")
    limits = Limits(fix_attempts=2, max_retry_attempts=3)
    in_call = decide(failure, tier_index=0, next_tier=1, limits=limits, call_retries=0)
    assert in_call.action is Action.END_ATTEMPT
    after = decide(failure, tier_index=0, next_tier=1, limits=limits, attempts=[attempt(1, E)])
    assert (after.action, after.tier_index) == (Action.ESCALATE, 1)  # no fix attempt first
    last = decide(failure, tier_index=1, next_tier=None, limits=limits, attempts=[attempt(1, E)])
    assert last.action is Action.FAIL_STEP
