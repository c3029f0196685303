"""The step task's work, driven directly (no Celery): retries, resumed and empty attempts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select, update

from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.engine.attempt import NO_CHANGES, execute_step
from merlin_flow.engine.dispatch import Outcome
from merlin_flow.engine.leases import claim
from merlin_flow.engine.verdict import verify_step
from merlin_flow.jobs.submission import create_job
from merlin_flow.jobs.views import job_view
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Step
from merlin_flow.tasklist import parse_tasklist
from merlin_flow.workspace.git import head_commit
from tests.unit.scripted_jobs import ONE_STEP, priced_tier, rate_limited_then_premium


def test_rate_limited_tier_retries_then_escalates(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    """Transient errors: same-tier retries with backoff, then a capability failure."""
    from merlin_flow.config import Limits
    from merlin_flow.store import LlmCall

    config = rate_limited_then_premium(
        tmp_path, Limits(max_retry_attempts=2, retry_base_delay=0.01, fix_attempts=1)
    )
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    outcomes = []
    for n in range(3):
        outcomes.append(execute_step(db, settings, job_id, "s0", f"w:{n}a"))
        outcomes.append(verify_step(db, settings, job_id, "s0", f"w:{n}b")[0])
    assert outcomes == [Outcome.CONTINUE, Outcome.RETRY] * 2 + [Outcome.CONTINUE] * 2
    view = job_view(db, job_id)
    attempts = view["steps"][0]["attempts"]
    assert [(a["kind"], a["tier"], a["status"]) for a in attempts] == [
        ("execute", "local", "error"),
        ("fix", "local", "error"),
        ("escalate", "premium", "passed"),
    ]
    assert "after 2 retries" in attempts[0]["error"]
    with db.reader() as session:
        errors = session.scalars(
            select(LlmCall.error).where(LlmCall.job_id == job_id, LlmCall.tier == "local")
        ).all()
    assert len(errors) == 6  # 1 call + 2 retries, in each of the two local attempts
    assert all(error is not None and error.startswith("RateLimitError") for error in errors)


def test_a_resumed_attempt_replays_paid_calls_instead_of_paying_again(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.agents.loop import first_messages
    from merlin_flow.engine.attempt import _begin_attempt
    from merlin_flow.engine.held_step import HeldStep
    from merlin_flow.models.journal import CallContext, record_call
    from merlin_flow.models.llm import complete
    from merlin_flow.store import Attempt, LlmCall
    from merlin_flow.tools.observations import READ_OUTPUT_SCHEMA, REPO_MAP_SCHEMA, TODO_SCHEMA
    from merlin_flow.tools.toolbox import TOOL_SCHEMAS

    tier = priced_tier(tmp_path, price_out=2.0)
    config = MerlinConfig(tiers=[tier])
    tasklist = parse_tasklist(ONE_STEP)
    job_id = create_job(db, settings, tasklist, py_repo, config)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    # Run 1: the worker claims the step, pays for turn 0, and dies.
    assert claim(db, step_id, "attempt", "dead", 30)
    plan, _repo, brief = _begin_attempt(
        HeldStep(db, settings, job_id, "s0", step_id, "dead", config, head_commit(py_repo))
    )
    schemas = [*TOOL_SCHEMAS, READ_OUTPUT_SCHEMA, TODO_SCHEMA, REPO_MAP_SCHEMA]  # context's last
    first = complete(tier, first_messages(brief, None), schemas)
    record_call(db, CallContext(job_id, step_id, plan.attempt_id, 1, tier), 0, 0, first, None)
    with db.session() as session:
        session.execute(
            update(Step).where(Step.id == step_id).values(lease_expires_at=datetime(2000, 1, 1))
        )
    # Run 2: a new worker takes over the same attempt.
    assert execute_step(db, settings, job_id, "s0", "alive") is Outcome.CONTINUE
    with db.reader() as session:
        calls = session.execute(
            select(LlmCall.run, LlmCall.turn, LlmCall.replayed, LlmCall.cost_usd).order_by(
                LlmCall.seq
            )
        ).all()
        attempt = session.scalars(select(Attempt)).one()
    assert [(c.run, c.turn, c.replayed) for c in calls] == [
        (1, 0, False),
        (2, 0, True),
        (2, 1, False),
    ]
    assert calls[1].cost_usd == 0
    assert attempt.runs == 2
    assert attempt.cost_usd == pytest.approx(calls[0].cost_usd + calls[2].cost_usd)
    assert job_view(db, job_id)["cost_usd"] == pytest.approx(attempt.cost_usd, abs=1e-6)


ONLY_TALKS = 'rules:\n  - reply: {content: "all done, nothing to change"}\n'


def _talking_job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, step_type: str
) -> str:
    script = tmp_path / "talks.yaml"
    script.write_text(ONLY_TALKS)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{script}")],
        limits=Limits(fix_attempts=0),
        exit_commands={step_type: "true"},
    )
    steps = [{"id": "s0", "step_type": step_type, "description": "answer 42"}]
    return create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), repo, config)


def test_an_attempt_that_changed_nothing_fails_without_verification(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    job_id = _talking_job(db, settings, py_repo, tmp_path, "Debug")
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    attempt = job_view(db, job_id)["steps"][0]["attempts"][0]
    assert attempt["status"] == "error"
    assert attempt["error"] == NO_CHANGES.format(turns=1)
    verify_step(db, settings, job_id, "s0", "w:2")
    view = job_view(db, job_id)
    assert view["status"] == "failed"  # its exit command (`true`) would have passed
    assert view["steps"][0]["attempts"][0]["exit_code"] is None  # never run
    assert "changed no file" in view["error"]


def test_a_verify_step_may_change_nothing(db: Database, py_repo: Path, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    job_id = _talking_job(db, settings, py_repo, tmp_path, "Verify")
    execute_step(db, settings, job_id, "s0", "w:1")
    verify_step(db, settings, job_id, "s0", "w:2")
    attempt = job_view(db, job_id)["steps"][0]["attempts"][0]
    assert (attempt["status"], attempt["exit_code"]) == ("passed", 0)


SPEC_WITH_INVARIANT = """\
# Answer

## Invariants
answer() never returns a negative number.

## Notes
Not a constraint: never shown to the agent.
"""


def _first_prompt(db: Database, settings: Settings, tmp_path: Path, files: dict[str, str]) -> str:
    """The user message of the first attempt of a job "answer 42" on a repo of ``files``."""
    from merlin_flow.store import Attempt, AttemptStatus
    from tests.conftest import make_repo
    from tests.unit.scripted_jobs import SCRIPT

    repo = make_repo(tmp_path / "repo", {"app.py": "def answer():\n    return 41\n", **files})
    (tmp_path / "script.yaml").write_text(SCRIPT)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{tmp_path / 'script.yaml'}")],
        exit_commands={"Debug": "true"},
    )
    steps = [{"id": "s0", "step_type": "Debug", "description": "answer 42"}]
    tasklist = parse_tasklist({"title": "t", "steps": steps})
    job_id = create_job(db, settings, tasklist, repo, config)
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    with db.reader() as session:
        attempt = session.scalars(select(Attempt)).one()
        assert attempt.status == AttemptStatus.COMMITTED
        return str(attempt.transcript[0]["content"])


def test_a_relevant_specs_invariant_reaches_the_agents_prompt(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    unrelated = "# Logging\n\n## Invariants\nLogs rotate daily.\n"
    prompt = _first_prompt(
        db,
        settings,
        tmp_path,
        {"specs/answer.md": SPEC_WITH_INVARIANT, "specs/logging.md": unrelated},
    )
    assert "Constraints from the project's specs:" in prompt
    assert "answer() never returns a negative number." in prompt
    assert "specs/answer.md" in prompt
    assert "Not a constraint" not in prompt  # constraint sections only, not the file
    assert "Logs rotate daily" not in prompt  # a spec sharing no word with the step


def test_without_specs_the_prompt_has_no_constraints(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    prompt = _first_prompt(db, settings, tmp_path, {})
    assert prompt.startswith("Step s0 (Debug): answer 42")
    assert "Constraints from the project's specs" not in prompt


def test_a_refused_reply_is_journaled_as_an_error_with_what_it_cost(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.agents.loop import first_messages
    from merlin_flow.engine.attempt import _begin_attempt
    from merlin_flow.engine.held_step import HeldStep
    from merlin_flow.errors import ModelRefused
    from merlin_flow.models.journal import CallContext, record_call, replayable_calls
    from merlin_flow.models.llm import complete
    from merlin_flow.store import Attempt, LlmCall
    from merlin_flow.tools.toolbox import TOOL_SCHEMAS

    tier = priced_tier(tmp_path, price_out=2.0)
    config = MerlinConfig(tiers=[tier])
    job_id = create_job(db, settings, parse_tasklist(ONE_STEP), py_repo, config)
    with db.reader() as session:
        step_id = session.scalars(select(Step.id).where(Step.job_id == job_id)).one()
    assert claim(db, step_id, "attempt", "me", 30)
    held = HeldStep(db, settings, job_id, "s0", step_id, "me", config, head_commit(py_repo))
    plan, _repo, brief = _begin_attempt(held)
    paid = complete(tier, first_messages(brief, None), TOOL_SCHEMAS)
    refusal = ModelRefused("I cannot help with that", paid)

    record_call(db, CallContext(job_id, step_id, plan.attempt_id, 1, tier), 0, 0, None, refusal)

    with db.reader() as session:
        call = session.scalars(select(LlmCall)).one()
        attempt = session.get_one(Attempt, plan.attempt_id)
        assert call.error == "ModelRefused: I cannot help with that"
        assert call.completion_tokens == paid.completion_tokens > 0
        assert attempt.cost_usd == pytest.approx(paid.cost_usd)
        assert replayable_calls(session, plan.attempt_id) == []  # never replayed as an answer


FAKE_OPENAI = "sk-test-0123456789abcdefSECRET"
FAKE_AWS = "AKIAIOSFODNN7EXAMPLE"
LEAKY = f"""\
rules:
  - match: 'Never write credentials'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {{path: app.py, old: "return 41", new: "return 42"}}
  - turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {{path: notes.txt, content: "notes\\n\\nkey {FAKE_OPENAI}\\n"}}
        - name: write_file
          arguments: {{path: src/config.py, content: "REGION = 'eu'\\nAWS_ID = '{FAKE_AWS}'\\n"}}
        - name: edit_file
          arguments: {{path: app.py, old: "return 41", new: "return 42"}}
  - reply: {{content: done}}
"""
FIXTURE = f"""\
rules:
  - turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments: {{path: tests/fixtures/aws.json, content: "{{\\"id\\": \\"{FAKE_AWS}\\"}}\\n"}}
        - name: edit_file
          arguments: {{path: app.py, old: "return 41", new: "return 42"}}
  - reply: {{content: done}}
"""


def _secret_job(
    db: Database, settings: Settings, repo: Path, tmp_path: Path, script: str, allow: list[str]
) -> str:
    from merlin_flow.tool_config import SecretScan

    (tmp_path / "leaky.yaml").write_text(script)
    config = MerlinConfig(
        tiers=[Tier(name="local", model=f"scripted/{tmp_path / 'leaky.yaml'}")],
        limits=Limits(fix_attempts=1),
        exit_commands={"Debug": "true"},
        secrets=SecretScan(allow=allow),
    )
    return create_job(db, settings, parse_tasklist(ONE_STEP), repo, config)


def _everything_git_holds(repo: Path) -> str:
    from tests.conftest import git

    refs = git(repo, "for-each-ref", "--format=%(refname)").splitlines()
    assert any(ref.startswith("refs/merlin/") for ref in refs)  # attempt refs are read too
    assert any(ref.startswith("refs/heads/merlin/") for ref in refs)  # and the job branch
    return git(repo, "log", "-p", "--all", "--full-history")


@pytest.fixture
def worker_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from merlin_flow.store.redaction import reset_redactor

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_OPENAI)
    reset_redactor()
    yield FAKE_OPENAI
    monkeypatch.delenv("OPENAI_API_KEY")
    reset_redactor()


def test_an_attempt_that_writes_secrets_commits_none_of_its_changes_and_is_fixed(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path, worker_secret: str
) -> None:
    from merlin_flow.engine.finalize import finalize_job
    from merlin_flow.store import Attempt, Event
    from merlin_flow.store.events import EventKind
    from merlin_flow.workspace.git import same_tree
    from merlin_flow.workspace.secret_scan import NEVER_WRITE

    job_id = _secret_job(db, settings, py_repo, tmp_path, LEAKY, [])
    assert execute_step(db, settings, job_id, "s0", "w:1") is Outcome.CONTINUE
    with db.reader() as session:
        first = session.scalars(select(Attempt)).one()
        events = session.scalars(
            select(Event).where(Event.kind == EventKind.SECRET_IN_DIFF).order_by(Event.id)
        ).all()
        assert (first.status, first.failure_kind) == ("error", "capability")
        error, commit, start = first.error or "", first.commit, first.start_commit
        assert [(e.message, e.data, e.step_key) for e in events] == [
            ("notes.txt:3: the value of OPENAI_API_KEY", {"attempt": 1}, "s0"),
            ("src/config.py:2: an AWS Access Key", {"attempt": 1}, "s0"),
        ]
    assert "notes.txt:3: the value of OPENAI_API_KEY\n  src/config.py:2: an AWS" in error
    assert NEVER_WRITE in error
    assert commit is not None
    assert same_tree(py_repo, commit, start)  # an empty commit: nothing of the attempt
    # The step goes on by the usual rules: a fix, told why, from a tree without the secrets.
    assert verify_step(db, settings, job_id, "s0", "w:2")[0] is Outcome.RETRY
    execute_step(db, settings, job_id, "s0", "w:3")
    verify_step(db, settings, job_id, "s0", "w:4")
    finalize_job(db, settings, job_id)
    view = job_view(db, job_id)
    attempts = view["steps"][0]["attempts"]
    assert [(a["kind"], a["status"]) for a in attempts] == [("execute", "error"), ("fix", "passed")]
    with db.reader() as session:
        fix = session.scalars(select(Attempt).where(Attempt.number == 2)).one()
        assert "src/config.py:2: an AWS Access Key" in (fix.feedback or "")
    history = _everything_git_holds(py_repo)
    assert "return 42" in history  # the fix's change is there
    patch = Path(view["patch"] or "").read_text()
    assert "return 42" in patch
    for secret in (FAKE_OPENAI, FAKE_AWS):
        assert secret not in history
        assert secret not in patch
        assert secret not in error


def test_a_key_format_in_an_allowed_path_is_committed(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.store import Attempt, Event
    from merlin_flow.store.events import EventKind
    from tests.conftest import git

    job_id = _secret_job(db, settings, py_repo, tmp_path, FIXTURE, ["tests/fixtures/**"])
    execute_step(db, settings, job_id, "s0", "w:1")
    with db.reader() as session:
        attempt = session.scalars(select(Attempt)).one()
        assert (attempt.status, attempt.error) == ("committed", None)
        refusals = select(Event).where(Event.kind == EventKind.SECRET_IN_DIFF)
        assert session.scalars(refusals).all() == []
    assert FAKE_AWS in git(py_repo, "show", f"{attempt.commit}:tests/fixtures/aws.json")
    # The same change without the allowlist fails.
    other = _secret_job(db, settings, py_repo, tmp_path, FIXTURE, [])
    execute_step(db, settings, other, "s0", "w:2")
    refused = job_view(db, other)["steps"][0]["attempts"][0]
    assert refused["status"] == "error"
    assert "tests/fixtures/aws.json:1: an AWS Access Key" in (refused["error"] or "")


def test_a_summarys_citations_are_checked_at_the_attempts_commit(
    db: Database, py_repo: Path, tmp_path: Path
) -> None:
    """app.py:2 holds at the attempt's commit; NOTES.md:3 does not (1 line written)."""
    settings = Settings(home=tmp_path / "home")
    script = tmp_path / "cites.yaml"
    summary = "kept app.py:2 and NOTES.md:3"
    calls = [{"name": "write_file", "arguments": {"path": "NOTES.md", "content": "ok\n"}},
             {"name": "finish", "arguments": {"summary": summary}}]  # fmt: skip
    script.write_text(yaml.safe_dump({"rules": [{"reply": {"tool_calls": calls}}]}))
    config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")],
                          exit_commands={"Debug": "true"})  # fmt: skip
    steps = [{"id": "s0", "step_type": "Debug", "description": "write notes"}]
    job_id = create_job(db, settings, parse_tasklist({"title": "t", "steps": steps}), py_repo,
                        config)  # fmt: skip
    execute_step(db, settings, job_id, "s0", "w:1")
    summary = job_view(db, job_id)["steps"][0]["attempts"][0]["summary"]  # status --json
    assert summary == (
        "kept app.py:2 and NOTES.md:3 [citation invalid: line 3 is past the end (1 line)]"
    )


# What a step costs merlin, pinned (`python -m tests.bench.step_work` prints it). Lower
# figures are welcome: then lower the bounds here too.
GIT_PROCESSES = 16
"""Per step of a Verify step that changes nothing: 4 `git worktree`, 2 `git describe`...,
and 1 `git ls-files` that finds the nested repositories an attempt made."""
TRANSACTIONS = 14
"""Per step: the claims, the attempt and its journal row, the verdict..."""


def test_a_step_starts_no_more_processes_nor_transactions_than_counted(
    tmp_path: Path, merlin_home: Path
) -> None:
    from tests.bench.step_work import measure

    figures = measure(2, "sqlite", tmp_path, warm=False)
    processes = figures["processes"]
    # The exit command goes to the worker process's command guard: no process of its own.
    assert all(name.startswith("git ") for name in processes), processes
    assert sum(processes.values()) <= GIT_PROCESSES, processes
    assert sum(figures["transactions"].values()) <= TRANSACTIONS, figures["transactions"]
    assert figures["processes"]["git worktree"] == 4  # an attempt's, and verify's
