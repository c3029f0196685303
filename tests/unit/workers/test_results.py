"""What Flower shows of a job's tasks: message labels (argsrepr), readable results, and
the FAILURE (one line, no traceback) of a task whose work failed."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery.canvas import _chain
from kombu.exceptions import OperationalError

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.engine.dispatch import Outcome, PlannedTask, TaskName, remaining_tasks
from merlin_flow.jobs.submission import create_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database
from merlin_flow.tasklist import parse_tasklist
from tests.unit.scripted_jobs import LOCAL_WRONG, ONE_STEP, scripted_job
from workers import tasks as worker_tasks
from workers.canvas import job_canvas
from workers.results import (
    AttemptState,
    StepState,
    read_steps,
    step_result,
    task_label,
    verify_result,
)

# The premium tier, asked to solve the step afresh after LOCAL_WRONG, gets it right.
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
    exit_command: str | None = "pytest -q",
) -> StepState:
    return StepState(job, error, step, phase, last, next_number, next_kind, next_tier, exit_command)


FAILED_1 = AttemptState(1, "execute", "local", "failed", "c1" * 20, exit_code=1)
PASSED_2 = AttemptState(2, "fix", "local", "passed", "c2" * 20, exit_code=0)
COMMITTED_1 = AttemptState(1, "execute", "local", "committed", "c1" * 20)


def test_labels_name_the_job_then_the_tier_and_attempt_then_the_step() -> None:
    assert task_label("abc") == "abc"
    assert task_label("abc", "fix", 2, "premium") == "abc [premium #2] fix"
    assert task_label("abc", "fix", None, None) == "abc fix"
    assert task_label("abc", "fix", 3, None) == "abc [#3] fix"
    # A long step key comes last: the tier and the attempt stay in front of it.
    long_key = "refactor-the-configuration-loader"
    assert task_label("abc", long_key, 1, "local").startswith("abc [local #1] ")
    queued = _state(phase="attempt", next_number=3, next_tier="premium", last=FAILED_1)
    assert queued.label(TaskName.STEP) == (3, "premium")
    assert queued.label(TaskName.VERIFY) == (3, "premium")  # the verify of that attempt
    waiting = _state(phase="verify", last=COMMITTED_1)
    assert waiting.label(TaskName.VERIFY) == (1, "local")  # the attempt that waits


def test_a_failed_verification_names_what_failed_then_what_follows() -> None:
    before = _state(last=COMMITTED_1)
    fix = verify_result("fix", before, _state(last=FAILED_1, phase="attempt"), Outcome.RETRY)
    assert fix.text == "`pytest -q` exited with code 1 -> fix on local (attempt 2)"
    assert fix.failed
    escalated = _state(last=FAILED_1, next_number=3, next_kind="escalate", next_tier="premium")
    escalation = verify_result("fix", before, escalated, Outcome.RETRY)
    assert escalation.text == "`pytest -q` exited with code 1 -> escalate to premium (attempt 3)"
    assert escalation.failed
    # No tier left: the job fails here.
    ended = _state(last=FAILED_1, job="failed", error="step fix failed on every tier: x\ny")
    result = verify_result("fix", before, ended, Outcome.STOP)
    assert result.text == (
        "`pytest -q` exited with code 1 -> job failed: step fix failed on every tier: x"
    )
    assert result.failed
    # An attempt the agent could not finish has no exit code: its error says why.
    error = AttemptState(1, "execute", "local", "error", error="model unreachable\ndetails")
    result = verify_result("fix", before, _state(last=error), Outcome.RETRY)
    assert result.text == "model unreachable -> fix on local (attempt 2)"
    # A spec check or an integration that failed after the command passed: its error.
    spec = AttemptState(1, "execute", "local", "failed", exit_code=0, error="spec: no mocks")
    result = verify_result("fix", before, _state(last=spec), Outcome.RETRY)
    assert (result.text, result.failed) == ("spec: no mocks -> fix on local (attempt 2)", True)
    # A step whose command is not known is still told apart by its exit code.
    unknown = verify_result("fix", before, _state(last=FAILED_1, exit_command=None), Outcome.RETRY)
    assert unknown.text.startswith("the exit command exited with code 1 -> ")


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
    assert not verify_result("fix", None, None, Outcome.CONTINUE).failed


def test_a_step_task_reports_its_attempt_and_fails_with_its_error() -> None:
    before = _state(phase="attempt", next_number=1, next_kind="execute", last=None)
    made = _state(last=COMMITTED_1)
    result = step_result("fix", before, made, Outcome.CONTINUE)
    assert result.text == f"committed {'c1' * 5} (attempt 1, execute on local)"
    assert not result.failed
    # The attempt ended in error (a failed model call): the task failed, with that line.
    error = AttemptState(1, "execute", "local", "error", error="model call failed: 401\nbody")
    result = step_result("fix", before, _state(last=error), Outcome.CONTINUE)
    assert (result.text, result.failed) == (
        "model call failed: 401 (attempt 1, execute on local)",
        True,
    )
    over_budget = _state(last=error, job="budget_exceeded", error="budget: $1 left")
    result = step_result("fix", before, over_budget, Outcome.STOP)
    assert result.text == "job budget_exceeded: budget: $1 left (attempt 1, execute on local)"
    assert result.failed
    # Another worker had the step: the last attempt is not this task's.
    older = _state(phase="attempt", next_number=2, last=FAILED_1)
    result = step_result("fix", older, older, Outcome.STOP)
    assert (result.text, result.failed) == ("stopped: another worker has step fix", False)


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
            ("merlin.step", f"{job_id} [local #1] s0", (job_id, "s0")),
            ("merlin.verify", f"{job_id} [local #1] s0", (job_id, "s0")),
        ]
    ]
    # Without the steps' states (or for a step it does not know), job and step only.
    bare = job_canvas(
        job_id, [[PlannedTask(TaskName.VERIFY, "s9")], [PlannedTask(TaskName.FINALIZE)]]
    )
    assert [[sig.options["argsrepr"] for sig in c.tasks] for c in bare] == [
        [f"{job_id} s9"],
        [job_id],
    ]


class _Worker:
    """The tasks run eagerly here: what they publish and the failures they report."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, db: Database, settings: Settings) -> None:
        self.published: list[list[tuple[str, Any]]] = []
        self.failures: list[tuple[str, str]] = []
        monkeypatch.setattr(worker_tasks, "runtime", lambda: (db, settings))
        monkeypatch.setattr(_chain, "apply_async", lambda chain, *_, **__: self._publish(chain))
        monkeypatch.setattr(worker_tasks, "_report_failure", self._report)

    def _publish(self, chain: Any) -> None:
        self.published.append([(sig.name, sig.options["argsrepr"]) for sig in chain.tasks])

    def _report(self, task: Any, text: str, runtime: float) -> None:
        assert runtime >= 0
        self.failures.append((task.name, text))

    def run(self, task: Any, *args: str) -> tuple[str, Any]:
        """The task's end state (IGNORED: it failed, and said so in its report) and result."""
        ran = task.apply(args=args)
        return ran.state, ran.result


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
    command = read_steps(db, job_id)["s0"].exit_command
    worker = _Worker(monkeypatch, db, settings)

    expected = [
        ("execute", "local", "fix on local (attempt 2)", (2, "local")),
        ("fix", "local", "escalate to premium (attempt 3)", (3, "premium")),
    ]
    for number, (kind, tier, following, (next_number, next_tier)) in enumerate(expected, 1):
        state, result = worker.run(worker_tasks.step_task, job_id, "s0")
        assert state == "SUCCESS"
        assert result.startswith("committed ")
        assert result.endswith(f" (attempt {number}, {kind} on {tier})")
        # A failed verification is no success: it reports its one line, and raised no
        # exception (no traceback); the next attempt follows all the same.
        state, _ = worker.run(worker_tasks.verify_task, job_id, "s0")
        assert state == "IGNORED"
        failure = f"`{command}` exited with code 1 -> {following}"
        assert worker.failures.pop() == ("merlin.verify", failure)
        label = f"{job_id} [{next_tier} #{next_number}] s0"
        assert worker.published.pop() == [("merlin.step", label), ("merlin.verify", label)]
    state, result = worker.run(worker_tasks.step_task, job_id, "s0")
    assert result.endswith(" (attempt 3, escalate on premium)")
    assert worker.run(worker_tasks.verify_task, job_id, "s0") == ("SUCCESS", "passed")
    # The last step passed: the verify publishes the finalize, as its child.
    assert worker.published.pop() == [("merlin.finalize", job_id)]
    again = worker.run(worker_tasks.verify_task, job_id, "s0")  # a message delivered twice
    assert again == ("SUCCESS", "nothing to do: step s0 is Completed (done)")
    assert worker.run(worker_tasks.finalize_task, job_id) == ("SUCCESS", "job completed")
    assert worker.published == []
    assert worker.failures == []


def test_a_failed_model_call_fails_the_step_task_and_its_verify_escalates(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "local.yaml").write_text("rules:\n  - reply: {error: AuthenticationError}\n")
    (tmp_path / "premium.yaml").write_text(PREMIUM_RIGHT)
    config = MerlinConfig(
        tiers=[
            Tier(name="local", model=f"scripted/{tmp_path / 'local.yaml'}"),
            Tier(name="premium", model=f"scripted/{tmp_path / 'premium.yaml'}"),
        ]
    )
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), py_repo, config)
    worker = _Worker(monkeypatch, db, settings)

    assert worker.run(worker_tasks.step_task, job_id, "s0")[0] == "IGNORED"
    name, line = worker.failures.pop()
    error = read_steps(db, job_id)["s0"].last
    assert error is not None
    assert error.status == "error"
    assert error.error
    assert name == "merlin.step"
    assert line == f"{error.error.splitlines()[0]} (attempt 1, execute on local)"
    assert "Traceback" not in line
    # Its verify decides what follows, as after any attempt.
    assert worker.run(worker_tasks.verify_task, job_id, "s0")[0] == "IGNORED"
    assert worker.failures.pop() == (
        "merlin.verify",
        f"{error.error.splitlines()[0]} -> escalate to premium (attempt 2)",
    )
    assert worker.run(worker_tasks.step_task, job_id, "s0")[0] == "SUCCESS"
    assert worker.run(worker_tasks.verify_task, job_id, "s0") == ("SUCCESS", "passed")
    assert worker.failures == []


def _request(**fields: Any) -> SimpleNamespace:
    defaults = {"id": "t1", "is_eager": False, "chain": None, "argsrepr": "abc [local #1] s0"}
    return SimpleNamespace(**{**defaults, **fields})


class _Task:
    """A bound task as ``_hand_on`` and ``_report_failure`` see it."""

    name = "merlin.verify"

    def __init__(self, request: SimpleNamespace, events: bool = True) -> None:
        self.request = request
        self.app = SimpleNamespace(conf=SimpleNamespace(worker_send_task_events=events))
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.broker_down = False

    def send_event(self, kind: str, **fields: Any) -> None:
        if self.broker_down:
            raise OperationalError("broker down")
        self.sent.append((kind, fields))


def test_a_failure_is_reported_as_celery_does_but_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = _Task(_request())
    worker_tasks._report_failure(task, "`pytest -q` exited with code 1", 2.5)
    assert task.sent == [
        (
            "task-failed",
            {
                "exception": "`pytest -q` exited with code 1",
                "result": "`pytest -q` exited with code 1",
                "runtime": 2.5,
            },
        )
    ]
    # Nobody listens to an eager call, or to a worker whose events are off.
    for quiet in (_Task(_request(is_eager=True)), _Task(_request(), events=False)):
        worker_tasks._report_failure(quiet, "x", 1.0)
        assert quiet.sent == []
    # A broker that cannot take the event: a warning, and the task still ends.
    task.broker_down = True
    with caplog.at_level(logging.WARNING, logger="workers.tasks"):
        worker_tasks._report_failure(task, "x", 1.0)
    assert "not reported to Flower" in caplog.text


def test_a_failing_task_hands_the_rest_of_its_chain_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    published: list[list[tuple[str, Any]]] = []
    monkeypatch.setattr(
        _chain,
        "apply_async",
        lambda chain, *a, **k: published.append(
            [(sig.name, sig.options.get("argsrepr")) for sig in chain.tasks]
        ),
    )
    verify = worker_tasks.verify_signature("abc", "s0", 1, "local")
    finalize = worker_tasks.finalize_signature("abc")
    # Celery keeps the rest of a chain last-first in the request.
    task = _Task(_request(chain=[dict(finalize), dict(verify)]))
    task.app = worker_tasks.step_task.app
    worker_tasks._hand_on(task)
    assert published == [[("merlin.verify", "abc [local #1] s0"), ("merlin.finalize", "abc")]]
    assert task.request.chain is None  # the chain no longer follows the task
    worker_tasks._hand_on(task)  # nothing left to follow
    assert len(published) == 1
    # With the failing task's own successors first (a failed verification's next attempt).
    step = worker_tasks.step_signature("abc", "s0", 2, "local")
    task.request.chain = [dict(finalize)]
    worker_tasks._hand_on(task, step)
    assert published[-1] == [("merlin.step", "abc [local #2] s0"), ("merlin.finalize", "abc")]
