"""What Flower shows of a job's tasks: message labels (argsrepr) and readable results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery.canvas import _chain

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.dispatch import Outcome, PlannedTask, TaskName, remaining_tasks
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from tests.unit.scripted_jobs import ONE_STEP, scripted_job
from workers import tasks as worker_tasks
from workers.canvas import job_canvas
from workers.results import (
    AttemptState,
    StepFailed,
    StepState,
    read_steps,
    step_result,
    task_label,
    verify_result,
)

# The cheap tier breaks the answer, then breaks it again when asked to repair it; the
# premium tier, asked to solve the step afresh, gets it right.
LOCAL_WRONG = """\
rules:
  - match: 'repair them'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 40", new: "return 43"}
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 40"}
  - reply: {content: "done"}
"""
PREMIUM_RIGHT = """\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - reply: {content: "fixed: 42"}
"""


def _state(
    last: AttemptState | None = None,
    *,
    job: str = "running",
    error: str | None = None,
    step: str = "InProgress",
    phase: str = "verify",
    next_number: int = 2,
    next_kind: str = "fix",
    next_tier: str | None = "local",
) -> StepState:
    return StepState(job, error, step, phase, last, next_number, next_kind, next_tier)


FAILED_1 = AttemptState(1, "execute", "local", "failed", "c1" * 20, exit_code=1)
PASSED_2 = AttemptState(2, "fix", "local", "passed", "c2" * 20, exit_code=0)
COMMITTED_1 = AttemptState(1, "execute", "local", "committed", "c1" * 20)


def test_labels_name_the_job_step_attempt_and_tier() -> None:
    assert task_label("abc") == "job=abc"
    assert task_label("abc", "fix", 2, "premium") == "job=abc step=fix attempt=2 tier=premium"
    assert task_label("abc", "fix", None, None) == "job=abc step=fix"
    queued = _state(phase="attempt", next_number=3, next_tier="premium", last=FAILED_1)
    assert queued.label(TaskName.STEP) == (3, "premium")
    assert queued.label(TaskName.VERIFY) == (3, "premium")  # the verify of that attempt
    waiting = _state(phase="verify", last=COMMITTED_1)
    assert waiting.label(TaskName.VERIFY) == (1, "local")  # the attempt that waits


def test_a_failed_verification_names_what_follows() -> None:
    before = _state(last=COMMITTED_1)
    fix = verify_result("fix", before, _state(last=FAILED_1, phase="attempt"), Outcome.RETRY)
    assert fix.text == "failed: exit 1 -> fix on local (attempt 2)"
    assert fix.failed
    escalated = _state(last=FAILED_1, next_number=3, next_kind="escalate", next_tier="premium")
    escalation = verify_result("fix", before, escalated, Outcome.RETRY)
    assert escalation.text == "failed: exit 1 -> escalate to premium (attempt 3)"
    assert escalation.failed
    # No tier left: the job fails here.
    ended = _state(last=FAILED_1, job="failed", error="step fix failed on every tier: x\ny")
    result = verify_result("fix", before, ended, Outcome.STOP)
    assert result.text == "failed: exit 1 -> job failed: step fix failed on every tier: x"
    assert result.failed
    # An attempt the agent could not finish has no exit code: its error says why.
    error = AttemptState(1, "execute", "local", "error", error="model unreachable\ndetails")
    result = verify_result("fix", before, _state(last=error), Outcome.RETRY)
    assert result.text == "failed: model unreachable -> fix on local (attempt 2)"


def test_a_passed_or_stopped_verification_is_no_failure() -> None:
    before = _state(last=COMMITTED_1)
    assert verify_result("fix", before, _state(last=PASSED_2), Outcome.CONTINUE).text == "passed"
    cancelled = AttemptState(1, "execute", "local", "cancelled", exit_code=0)
    result = verify_result("fix", before, _state(last=cancelled, job="cancelled"), Outcome.STOP)
    assert (result.text, result.failed) == ("job cancelled", False)
    lost = verify_result("fix", before, _state(last=COMMITTED_1), Outcome.STOP)
    assert (lost.text, lost.failed) == ("stopped: another worker has step fix", False)
    # Passed, but the job could not take the commit: the job failed here.
    moved = _state(last=PASSED_2, job="failed", error="branch moved")
    result = verify_result("fix", before, moved, Outcome.STOP)
    assert (result.text, result.failed) == ("passed -> job failed: branch moved", True)
    # A duplicate message, or one for a finished job, did nothing.
    done = _state(last=PASSED_2, step="Completed", phase="done")
    result = verify_result("fix", done, done, Outcome.STOP)
    assert (result.text, result.failed) == ("nothing to do: step fix is Completed (done)", False)
    over = _state(job="failed", error="e")
    result = verify_result("fix", over, over, Outcome.STOP)
    assert (result.text, result.failed) == ("nothing to do: job failed", False)
    # The store could not be read: the outcome alone.
    assert verify_result("fix", None, None, Outcome.RETRY).failed


def test_a_step_task_reports_its_attempt() -> None:
    before = _state(phase="attempt", next_number=1, next_kind="execute", last=None)
    made = _state(last=COMMITTED_1)
    result = step_result("fix", before, made, Outcome.CONTINUE)
    assert result.text == f"attempt 1 (execute) on local: committed {'c1' * 5}"
    error = AttemptState(1, "execute", "local", "error", error="no file changed")
    result = step_result("fix", before, _state(last=error), Outcome.CONTINUE)
    assert (result.text, result.failed) == (
        "attempt 1 (execute) on local: error: no file changed",
        False,
    )
    over_budget = _state(last=error, job="budget_exceeded", error="budget: $1 left")
    result = step_result("fix", before, over_budget, Outcome.STOP)
    assert result.text == "attempt 1 (execute) on local -> job budget_exceeded: budget: $1 left"
    assert result.failed
    # Another worker had the step: the last attempt is not this task's.
    older = _state(phase="attempt", next_number=2, last=FAILED_1)
    result = step_result("fix", older, older, Outcome.STOP)
    assert result.text == "stopped: another worker has step fix"


def test_the_canvas_labels_each_message(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    job_id = scripted_job(db, settings, py_repo, tmp_path, steps=2)
    steps = read_steps(db, job_id)
    assert read_steps(db, "nosuchjob") == {}
    canvas = job_canvas(job_id, remaining_tasks(db, job_id), steps)
    labels = [[(sig.name, sig.options["argsrepr"], sig.args) for sig in c.tasks] for c in canvas]
    # A plain list is a sequence: only its first step is queued; the second follows its pass.
    assert labels == [
        [
            ("merlin.step", f"job={job_id} step=s0 attempt=1 tier=local", (job_id, "s0")),
            ("merlin.verify", f"job={job_id} step=s0 attempt=1 tier=local", (job_id, "s0")),
        ]
    ]
    # Without the steps' states (or for a step it does not know), job and step only.
    bare = job_canvas(
        job_id, [[PlannedTask(TaskName.VERIFY, "s9")], [PlannedTask(TaskName.FINALIZE)]]
    )
    assert [[sig.options["argsrepr"] for sig in c.tasks] for c in bare] == [
        [f"job={job_id} step=s9"],
        [f"job={job_id}"],
    ]


def test_the_tasks_of_an_escalating_job_end_as_flower_shows_them(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "local.yaml").write_text(LOCAL_WRONG)
    (tmp_path / "premium.yaml").write_text(PREMIUM_RIGHT)
    config = MerlinConfig(
        tiers=[
            Tier(name="local", model=f"scripted/{tmp_path / 'local.yaml'}"),
            Tier(name="premium", model=f"scripted/{tmp_path / 'premium.yaml'}"),
        ]
    )
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), py_repo, config)
    monkeypatch.setattr(worker_tasks, "runtime", lambda: (db, settings))
    published: list[list[tuple[str, Any]]] = []

    def publish(self: Any, *args: Any, **kwargs: Any) -> None:
        published.append([(sig.name, sig.options["argsrepr"]) for sig in self.tasks])

    monkeypatch.setattr(_chain, "apply_async", publish)

    def run(task: Any) -> Any:
        return task.apply(args=(job_id, "s0"))

    expected = [
        ("execute", "local", "failed: exit 1 -> fix on local (attempt 2)", (2, "local")),
        ("fix", "local", "failed: exit 1 -> escalate to premium (attempt 3)", (3, "premium")),
    ]
    for number, (kind, tier, failure, (next_number, next_tier)) in enumerate(expected, 1):
        step = run(worker_tasks.step_task)
        assert step.state == "SUCCESS"
        assert step.result.startswith(f"attempt {number} ({kind}) on {tier}: committed ")
        verify = run(worker_tasks.verify_task)
        assert verify.state == "FAILURE"  # a failed verification is no success...
        assert isinstance(verify.result, StepFailed)
        assert repr(verify.result) == failure  # ...and Flower shows what follows
        label = f"job={job_id} step=s0 attempt={next_number} tier={next_tier}"
        assert published.pop() == [("merlin.step", label), ("merlin.verify", label)]
    step = run(worker_tasks.step_task)
    assert step.result.startswith("attempt 3 (escalate) on premium: committed ")
    verify = run(worker_tasks.verify_task)
    assert (verify.state, verify.result) == ("SUCCESS", "passed")
    # The last step passed: the verify publishes the finalize, as its child.
    assert published.pop() == [("merlin.finalize", f"job={job_id}")]
    again = run(worker_tasks.verify_task)  # a message delivered twice
    assert again.result == "nothing to do: step s0 is Completed (done)"
    assert worker_tasks.finalize_task.apply(args=(job_id,)).result == "job completed"
    assert published == []
