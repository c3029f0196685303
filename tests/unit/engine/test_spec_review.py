"""The spec check as a verification makes it: enforce, warn, off, a failed check, a replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from merlin_flow.config import Limits, MerlinConfig, Specs, Tier
from merlin_flow.engine.attempt import execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.finalize import finalize_job
from merlin_flow.engine.spec_review import SPEC_CHECK_TURN
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Event, LlmCall
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import make_repo

# A job whose first attempt breaks the spec's invariant (answer() returns -42) and whose
# fix attempt (it sees the violation in its feedback) repairs it.
SPEC = """\
# Answer

## Purpose
The answer module gives the answer.

## Invariants
answer() never returns a negative number.
"""
AGENT = """\
rules:
  - match: "VIOLATION app.py"
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return -42", new: "return 42"}
  - turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return -42"}
  - reply: {content: done}
"""
CHECKER = """\
rules:
  - match: "\\\\+    return -42"
    reply: {content: "I compared it.\\nVIOLATION app.py:2: answer() returns a negative number"}
  - reply: {content: PASS}
"""


def _job(
    db: Database,
    settings: Settings,
    tmp_path: Path,
    specs: Specs,
    spec_check: bool = False,
    checker: str = CHECKER,
    agent: str = AGENT,
    steps: list[dict[str, Any]] | None = None,
) -> str:
    repo = make_repo(
        tmp_path / "repo",
        {"app.py": "def answer():\n    return 41\n", "specs/answer.md": SPEC},
    )
    (tmp_path / "agent.yaml").write_text(agent)
    (tmp_path / "checker.yaml").write_text(checker)
    config = MerlinConfig(
        tiers=[
            Tier(name="local", model=f"scripted/{tmp_path / 'agent.yaml'}"),
            Tier(name="checker", model=f"scripted/{tmp_path / 'checker.yaml'}"),
        ],
        exit_commands={"Debug": "true"},
        specs=specs,
        limits=Limits(fix_attempts=0) if steps else Limits(),
    )
    step = {"id": "s0", "step_type": "Debug", "description": "make answer return 42"}
    steps = steps or [{**step, "spec_check": spec_check}]
    return create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)


def _run(db: Database, settings: Settings, job_id: str) -> list[Outcome]:
    outcomes = []
    for n in range(4):
        outcomes.append(execute_step(db, settings, job_id, "s0", f"w:{n}a"))
        outcomes.append(verify_step(db, settings, job_id, "s0", f"w:{n}b")[0])
        if outcomes[-1] is not Outcome.RETRY:
            break
    return outcomes


def _events(db: Database, job_id: str, kind: str) -> list[Event]:
    with db.reader() as session:
        return list(
            session.scalars(select(Event).where(Event.job_id == job_id, Event.kind == kind))
        )


def test_enforce_fails_the_attempt_that_breaks_an_invariant_and_the_fix_passes(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    job_id = _job(db, settings, tmp_path, Specs(check_tier="checker"), spec_check=True)
    assert _run(db, settings, job_id) == [
        Outcome.CONTINUE,
        Outcome.RETRY,
        Outcome.CONTINUE,
        Outcome.CONTINUE,
    ]
    attempts = job_view(db, job_id)["steps"][0]["attempts"]
    assert [(a["kind"], a["tier"], a["status"]) for a in attempts] == [
        ("execute", "local", "failed"),
        ("fix", "local", "passed"),
    ]
    assert attempts[0]["exit_code"] == 0
    assert "VIOLATION app.py:2: answer() returns a negative number" in attempts[0]["error"]
    (violation,) = _events(db, job_id, "spec_violation")
    assert violation.data["violations"] == [
        "VIOLATION app.py:2: answer() returns a negative number"
    ]
    assert violation.data["specs"] == ["specs/answer.md"]
    assert [e.message for e in _events(db, job_id, "spec_check")] == [
        "spec check passed (specs/answer.md)"
    ]
    with db.reader() as session:
        checks = session.scalars(
            select(LlmCall).where(LlmCall.job_id == job_id, LlmCall.tier == "checker")
        ).all()
    assert [(c.turn, c.error) for c in checks] == [(SPEC_CHECK_TURN, None)] * 2


def test_enforce_fails_the_job_when_every_attempt_breaks_the_spec(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    always = 'rules:\n  - reply: {content: "VIOLATION app.py:2: negative"}\n'
    job_id = _job(
        db, settings, tmp_path, Specs(check="enforce", check_tier="checker"), checker=always
    )
    outcomes = _run(db, settings, job_id)
    assert outcomes[-1] is Outcome.STOP
    view = job_view(db, job_id)
    assert view["status"] == "failed"  # `merlin run` exits with code 1
    local = [a for a in view["steps"][0]["attempts"] if a["tier"] == "local"]
    assert [(a["kind"], a["status"]) for a in local] == [("execute", "failed"), ("fix", "failed")]
    for attempt in local:
        assert attempt["error"].startswith("spec check: the change breaks the project's specs")


def test_warn_records_the_violations_and_passes(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    job_id = _job(
        db, settings, tmp_path, Specs(check="warn", check_tier="checker"), spec_check=True
    )
    assert _run(db, settings, job_id) == [Outcome.CONTINUE, Outcome.CONTINUE]
    attempts = job_view(db, job_id)["steps"][0]["attempts"]
    assert [a["status"] for a in attempts] == ["passed"]
    (warning,) = _events(db, job_id, "spec_warning")
    assert "VIOLATION app.py:2: answer() returns a negative number" in warning.message
    finalize_job(db, settings, job_id)
    summary = (settings.jobs_dir / job_id / "summary.md").read_text()
    assert f"## Warnings\n\n- {warning.message}" in summary
    assert warning.data["policy"] == "warn"


def test_a_check_that_cannot_run_is_noted_and_passes(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    broken = "rules:\n  - reply: {error: AuthenticationError}\n"
    job_id = _job(
        db, settings, tmp_path, Specs(check="enforce", check_tier="checker"), checker=broken
    )
    assert _run(db, settings, job_id) == [Outcome.CONTINUE, Outcome.CONTINUE]
    (note,) = _events(db, job_id, "spec_check")
    assert note.message.startswith("spec check could not run: ")


def test_off_checks_nothing(db: Database, settings: Settings, tmp_path: Path) -> None:
    job_id = _job(db, settings, tmp_path, Specs(check_tier="checker"))
    assert _run(db, settings, job_id) == [Outcome.CONTINUE, Outcome.CONTINUE]
    with db.reader() as session:
        assert not session.scalars(select(LlmCall).where(LlmCall.tier == "checker")).all()
    assert not _events(db, job_id, "spec_check")


def test_a_replay_takes_the_spec_checks_answers_from_its_original(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    from merlin_flow.engine.finalize import finalize_job
    from merlin_flow.jobs.replay import create_replay

    job_id = _job(db, settings, tmp_path, Specs(check="enforce", check_tier="checker"))
    _run(db, settings, job_id)
    finalize_job(db, settings, job_id)
    replay_id = create_replay(db, settings, job_id)
    assert _run(db, settings, replay_id) == [
        Outcome.CONTINUE,
        Outcome.RETRY,
        Outcome.CONTINUE,
        Outcome.CONTINUE,
    ]
    attempts = job_view(db, replay_id)["steps"][0]["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "passed"]
    assert len(_events(db, replay_id, "spec_violation")) == 1
    with db.reader() as session:
        live = session.scalars(select(LlmCall).where(LlmCall.job_id == replay_id)).all()
    assert all(call.replayed for call in live)  # nothing went live, the check included


def test_a_step_is_held_to_the_jobs_base_specs_not_what_an_earlier_step_wrote(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    """A model's first step empties the spec; the second breaks its invariant: it fails."""
    agent = """\
rules:
  - match: 'Step weaken \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {path: specs/answer.md, content: "# Answer\\n"}
  - match: 'Step break \\('
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return -42"}
  - reply: {content: done}
"""
    steps = [
        {"id": "weaken", "step_type": "Debug", "description": "tidy the answer spec"},
        {"id": "break", "step_type": "Debug", "description": "answer", "depends_on": ["weaken"]},
    ]
    specs = Specs(check="enforce", check_tier="checker")
    job_id = _job(db, settings, tmp_path, specs, agent=agent, steps=steps)
    for key in ("weaken", "break"):
        execute_step(db, settings, job_id, key, f"{key}:a")
        verify_step(db, settings, job_id, key, f"{key}:b")
    steps_by_key = {s["id"]: s for s in job_view(db, job_id)["steps"]}
    assert steps_by_key["weaken"]["status"] == "Completed"
    assert steps_by_key["break"]["attempts"][0]["status"] == "failed"
    assert [e.step_key for e in _events(db, job_id, "spec_violation")] == ["break"]
