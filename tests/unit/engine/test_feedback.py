"""feedback_for and failure_of: what a failed attempt stands for, and what the next one is told."""

from __future__ import annotations

from types import SimpleNamespace

from merlin_flow.engine.feedback import (
    FEEDBACK_CHARS,
    decisive_lines,
    failure_of,
    failure_reason,
    feedback_for,
    step_failure,
    summary_line,
)
from merlin_flow.failures import AttemptKind, Failure, FailureKind
from tests.unit.attempts import attempt

E, F, X = AttemptKind.EXECUTE, AttemptKind.FIX, AttemptKind.ESCALATE


def test_failure_reason_prefers_error() -> None:
    assert failure_reason(attempt(1, E, error="model refused")) == "model refused"
    assert failure_reason(attempt(1, E, exit_code=3)) == "`python -m pytest -q` exited with code 3"


def test_a_failed_merge_recheck_is_the_cause_not_the_model_error_after_it() -> None:
    recheck = attempt(
        1,
        E,
        error="integration failed: `python -m pytest -q` exited with code 1 on the step's "
        "change merged onto the job branch (1a2b3c4d5e); it passed alone",
        output_tail="test_a.py F\nFAILED test_a.py::test_merge\n1 failed, 3 passed",
    )
    refused = attempt(2, X, tier="premium", status="error", exit_code=None, error="RateLimitError")
    text = step_failure(SimpleNamespace(attempts=[recheck, refused]))
    first, *rest = text.splitlines()
    assert first.startswith("attempt 1 (execute on tier local): integration failed: `python")
    assert "    1 failed, 3 passed" in rest
    assert rest[-1] == "then attempt 2 (escalate on tier premium): RateLimitError"


# --- feedback_for ----------------------------------------------------------------------


def test_execute_gets_no_feedback() -> None:
    assert feedback_for(E, []) is None
    assert feedback_for(E, [attempt(1, E, output_tail="boom")]) is None


def test_no_failed_attempts_gives_no_feedback() -> None:
    assert feedback_for(F, [attempt(1, E, status="passed", exit_code=0)]) is None


def test_fix_gets_only_the_last_failure() -> None:
    attempts = [
        attempt(1, E, output_tail="FIRST OUTPUT", exit_code=1),
        attempt(2, F, output_tail="  SECOND OUTPUT\n", exit_code=4),
    ]
    text = feedback_for(F, attempts)
    assert text is not None
    assert "FIRST OUTPUT" not in text
    assert "Attempt 2 (fix on tier local): `python -m pytest -q` exited with code 4" in text
    assert "Output (tail):\nSECOND OUTPUT\n" in text
    assert text.endswith("repair them.")


def test_a_fix_after_secrets_were_refused_is_not_told_its_changes_are_there() -> None:
    from merlin_flow.workspace.secret_scan import SecretHit, secret_error

    refused = secret_error([SecretHit("notes.txt", 3, "the value of OPENAI_API_KEY")])
    text = feedback_for(F, [attempt(1, E, error=refused, exit_code=None)])
    assert text is not None
    assert "notes.txt:3: the value of OPENAI_API_KEY" in text
    assert "repair them" not in text
    assert text.endswith("back where that attempt began: do it again.")


def test_fix_feedback_keeps_the_tail_of_long_output() -> None:
    output = "HEAD" + "x" * (FEEDBACK_CHARS * 2) + "TAIL"
    text = feedback_for(F, [attempt(1, E, output_tail=output)])
    assert text is not None
    assert "TAIL" in text
    assert "HEAD" not in text


def test_escalate_gets_all_failures() -> None:
    attempts = [
        attempt(1, E, tier="local", output_tail="OUT-ONE", exit_code=1),
        attempt(2, F, tier="local", status="error", error="turn limit", exit_code=None),
        attempt(3, F, tier="local", output_tail="OUT-THREE", exit_code=5),
    ]
    text = feedback_for(X, attempts)
    assert text is not None
    for expected in (
        "Attempt 1 (execute on tier local): `python -m pytest -q` exited with code 1",
        "OUT-ONE",
        "Attempt 2 (fix on tier local): turn limit",
        "Attempt 3 (fix on tier local): `python -m pytest -q` exited with code 5",
        "OUT-THREE",
    ):
        assert expected in text
    assert text.index("Attempt 1") < text.index("Attempt 2") < text.index("Attempt 3")
    assert text.endswith("solve the step afresh.")


def test_escalate_ignores_attempts_that_did_not_fail() -> None:
    attempts = [
        attempt(1, E, status="running", output_tail="STILL-RUNNING"),
        attempt(2, E, output_tail="REAL-FAILURE"),
    ]
    text = feedback_for(X, attempts)
    assert text is not None
    assert "STILL-RUNNING" not in text
    assert "REAL-FAILURE" in text


def test_failure_of_reads_the_stored_kind_never_the_error_text() -> None:
    error = "tier 'fast' (openai/x): missing credentials"
    unreachable = attempt(1, E, status="error", exit_code=None, error=error, failure_kind="access")
    assert failure_of(unreachable) == Failure(FailureKind.ACCESS, error)
    looks_alike = attempt(1, E, status="error", exit_code=None, error="model unreachable: x")
    assert failure_of(looks_alike).kind is FailureKind.CAPABILITY
    failed = attempt(1, E, exit_code=1)
    assert failure_of(failed).kind is FailureKind.CAPABILITY


# --- what a step's failure quotes ----------------------------------------------------------

TAP = """\
TAP version 13
not ok 1 - adds
  error: 'NaN !== 7'
1..1
# tests 1
# pass 0
# fail 1
# cancelled 0
# skipped 0
# duration_ms 79.24
"""
VITEST = """\
 FAIL  test/defu.test.ts > defu > concats arrays
 Test Files  1 failed | 1 passed (2)
      Tests  2 failed | 21 passed (23)
   Start at  20:35:35
   Duration  406ms (transform 70ms)
"""


def test_the_summary_line_is_the_count_not_a_timing_printed_after_it() -> None:
    assert summary_line(TAP) == "# fail 1"
    assert summary_line(VITEST) == "Tests  2 failed | 21 passed (23)"
    assert summary_line("collected 3\n1 failed, 2 passed in 0.1s\n") == "1 failed, 2 passed in 0.1s"
    assert summary_line("nothing to see\nbye\n") == "bye"
    assert summary_line("") == ""


def test_a_step_failure_quotes_the_marked_failures_before_the_tail() -> None:
    assert decisive_lines(TAP)[:2] == ["not ok 1 - adds", "…"]
    assert decisive_lines(TAP)[-1] == "# duration_ms 79.24"
    assert decisive_lines(VITEST) == VITEST.rstrip().splitlines()  # all in the tail
    plain = "\n".join(f"line {n}" for n in range(9))
    assert decisive_lines(plain) == [f"line {n}" for n in range(4, 9)]
    attempts = [attempt(1, E, exit_code=1, output_tail=TAP)]
    text = step_failure(SimpleNamespace(attempts=attempts))
    assert text.splitlines()[0].endswith("exited with code 1: # fail 1")
    assert "    not ok 1 - adds" in text.splitlines()
