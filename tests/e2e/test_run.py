"""`merlin run` (embedded worker) and `merlin demo`, end to end as subprocesses."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.conftest import git
from tests.e2e.conftest import Backend
from tests.e2e.doc_examples import quickstart_demo_mismatches, shows
from tests.e2e.helpers import merlin, merlin_env, start_worker, stop_worker, write_job_files
from tests.unit.scripted_jobs import LOCAL_WRONG

pytestmark = pytest.mark.e2e

# The cheap tier (LOCAL_WRONG) gets step "fix" wrong twice; the premium tier gets it right.
PREMIUM_RIGHT = """\
rules:
  - match: 'solve the step afresh'
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: app.py, old: "return 41", new: "return 42"}
  - reply: {content: "fixed: 42"}
"""
ONE_STEP = """\
title: Fix answer
steps:
  - id: fix
    step_type: Debug
    description: answer() must return 42
"""


def test_escalation_execute_fix_escalate(tmp_path: Path, py_repo: Path, backend: Backend) -> None:
    """`merlin run` on the embedded defaults; a worker process and `submit --wait` on Redis."""
    env = merlin_env(tmp_path / "home", **backend.env)
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    job_args = [str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"]
    job_args += ["--junit", str(tmp_path / "merlin.xml"), "--patch", str(tmp_path / "merlin.patch")]
    if backend.name == "embedded":
        result = merlin(env, "run", *job_args)
    else:
        worker = start_worker(env, tmp_path / "worker.log", "--concurrency", "2")
        try:
            result = merlin(env, "submit", "--wait", *job_args)
        finally:
            stop_worker(worker)
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "completed"
    assert "+    return 42" in (tmp_path / "merlin.patch").read_text()
    suite = ElementTree.parse(tmp_path / "merlin.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures")) == ("1", "0")
    (step,) = view["steps"]
    assert step["tier"] == "premium"
    assert [(a["kind"], a["tier"], a["status"]) for a in step["attempts"]] == [
        ("execute", "local", "failed"),
        ("fix", "local", "failed"),
        ("escalate", "premium", "passed"),
    ]
    assert [a["exit_code"] for a in step["attempts"]] == [1, 1, 0]
    # The failed attempts stay inspectable under their own refs; the branch has the pass.
    refs = git(py_repo, "for-each-ref", "--format=%(refname)", f"refs/merlin/{view['id']}")
    assert len(refs.splitlines()) == 3
    assert "return 43" in git(py_repo, "show", f"refs/merlin/{view['id']}/fix/2:app.py")
    assert "return 42" in git(py_repo, "show", f"merlin/{view['id']}:app.py")
    # A premium call was paid for; the local tier here is priced too.
    assert view["cost_usd"] > 0

    # `merlin logs`: each attempt's conversation and its exit command's output.
    logs = merlin(env, "logs", view["id"], "--step", "fix")
    assert logs.returncode == 0, logs.stderr
    text = logs.stdout
    assert "step fix · attempt 1 · execute@local · failed, exit code 1" in text
    assert "step fix · attempt 3 · escalate@premium · passed, exit code 0" in text
    assert '→ edit_file {"path": "app.py", "old": "return 41", "new": "return 40"}' in text
    assert "← edited app.py" in text
    assert "$ python -m pytest -q  (exit code 1)" in text
    entries = json.loads(merlin(env, "logs", view["id"], "--json").stdout)
    assert [e["number"] for e in entries] == [1, 2, 3]
    assert entries[2]["transcript"][0]["role"] == "user"
    assert "solve the step afresh" in entries[2]["transcript"][0]["content"]
    assert entries[0]["output_tail"]  # the failing pytest output
    unknown = merlin(env, "logs", view["id"], "--step", "nosuch")
    assert unknown.returncode == 2
    assert "has no step 'nosuch'; its steps: fix" in unknown.stderr


def test_failing_every_tier_fails_the_job_with_exit_code_1(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium="rules: []\n", tasklist=ONE_STEP
    )
    junit, patch = tmp_path / "out" / "merlin.xml", tmp_path / "out" / "merlin.patch"
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json",
        "--junit", str(junit), "--patch", str(patch),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "failed"
    assert "step fix failed on every tier" in view["error"]
    # CI reports: the failed step is a failed test case; nothing verified, so no diff.
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("1", "1", "0")
    case = suite.find("testcase")
    assert case is not None
    assert case.get("name") == "fix (Debug)"
    failure = case.find("failure")
    assert failure is not None
    assert "failed on every tier" in (failure.get("message") or "")
    assert "attempt 3: escalate@premium -> error" in (failure.text or "")
    failure.text = failure.text or ""
    assert patch.read_text() == ""
    attempts = view["steps"][0]["attempts"]
    assert [(a["kind"], a["tier"], a["status"]) for a in attempts] == [
        ("execute", "local", "failed"),
        ("fix", "local", "failed"),
        ("escalate", "premium", "error"),
        ("fix", "premium", "error"),
    ]
    assert "no rule fits" in attempts[2]["error"]
    summary = (Path(view["patch"]).parent / "summary.md").read_text()
    assert "status: **failed**" in summary
    assert (
        "| fix | Debug | Failed | execute@local: 1, fix@local: 1, escalate@premium: error"
        in summary
    )
    # Nothing verified: the job branch did not move.
    assert git(py_repo, "rev-parse", f"merlin/{view['id']}") == git(py_repo, "rev-parse", "main")
    # In a pipe (a CI log) status prints whole lines, not a table cut at 80 columns.
    lines = merlin(env, "status", view["id"]).stdout.splitlines()
    step_line = next(line for line in lines if line.startswith("  fix · Debug · Failed · "))
    assert "escalate@premium ✗  fix@premium ✗ · exit command: python -m pytest -q" in step_line
    assert len(step_line) > 80
    assert f"error: {view['error'].splitlines()[0]}" in lines
    # The cause, even though the last attempts never reached their model: the failing
    # exit command, its last lines, then what came after (status, --json, the outcome).
    assert view["error"].startswith(
        "step fix failed on every tier: attempt 2 (fix on tier local): "
        "`python -m pytest -q` exited with code 1: 1 failed in "
    )
    assert "FAILED test_app.py::test_answer - assert 43 == 42" in view["error"]
    assert "then attempt 3 (escalate on tier premium): model call failed" in view["error"]
    assert (view["failure"]["attempt"], view["failure"]["exit_code"]) == (2, 1)
    # docs/quickstart.md shows this outcome, abridged: it must stay true.
    quickstart = (Path(__file__).parents[2] / "docs" / "quickstart.md").read_text()
    shown = re.search(r"```text\n(job [0-9a-f]{12} failed: .*?)```", quickstart, re.S)
    assert shown is not None
    assert shows(f"job {view['id']} failed: {view['error']}\n", shown.group(1))
    assert "FAILED test_app.py::test_answer - assert 43 == 42" in failure.text


def test_demo_escalates_and_succeeds(tmp_path: Path) -> None:
    env = merlin_env(tmp_path / "home")
    result = merlin(env, "demo", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # docs/quickstart.md shows this output, from a real run: it must stay true.
    assert quickstart_demo_mismatches(out) == []
    assert "scripted" in out.lower()
    assert "next: escalate on tier premium" in out
    assert "step fix passed on tier premium" in out
    assert "escalate@premium" in out
    assert "+    return sum(values) / len(values)" in out
    assert "completed" in out

    # `merlin replay` runs the finished demo job again from its journal, offline.
    (job,) = json.loads(merlin(env, "list", "--json").stdout)
    result = merlin(env, "replay", job["id"], "--json", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["reproduced"] is True
    assert report["original"] == job["id"]
    assert report["replay"] != job["id"]
    assert [s["step"] for s in report["steps"]] == ["fix", "guard", "median"]
    fix = report["steps"][0]
    assert fix["replay_path"] == "execute@local, fix@local, escalate@premium"
    assert all(
        s["same_tree"] and s["replay_commit"] != s["original_commit"] for s in report["steps"]
    )
    assert report["calls"] > 0
    replay = json.loads(merlin(env, "status", report["replay"], "--json").stdout)
    assert replay["replay_of"] == job["id"]
    assert replay["branch"] == f"merlin/{report['replay']}"
    assert replay["cost_usd"] == 0.0
    costs = json.loads(merlin(env, "costs", report["replay"], "--json").stdout)
    assert costs["total"]["replayed_calls"] == costs["total"]["calls"] == report["calls"]

    # A journal missing answers cannot reproduce the job: exit code 1, the differing step named.
    with sqlite3.connect(tmp_path / "home" / "merlin.db") as conn:
        conn.execute(
            "DELETE FROM llm_calls WHERE job_id = ? AND step_id = "
            "(SELECT id FROM steps WHERE job_id = ? AND key = 'median')",
            (job["id"], job["id"]),
        )
    result = merlin(env, "replay", job["id"], timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT reproduced" in result.stdout
    assert "differs" in result.stdout
    # ... and why, under the verdict.
    assert "the original completed, the replay failed" in result.stdout
    assert "step median: the original's attempts were execute@local" in result.stdout


def test_replay_refuses_unknown_and_unfinished_jobs(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    result = merlin(env, "replay", "nosuchjob")
    assert result.returncode == 2
    assert "no job with id 'nosuchjob'" in result.stderr
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    submitted = merlin(
        env, "submit", str(tasklist), "--repo", str(py_repo), "--config", str(config)
    )
    job_id = submitted.stdout.strip()
    result = merlin(env, "replay", job_id)
    assert result.returncode == 2
    assert f"job {job_id} has not finished (status pending)" in result.stderr


def test_run_on_postgres(tmp_path: Path, py_repo: Path, postgres_url: str) -> None:
    """Any SQLAlchemy URL holds the state: `merlin db upgrade`, then jobs on Postgres."""
    env = merlin_env(tmp_path / "home", MERLIN_DATABASE_URL=postgres_url)
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    refused = merlin(env, "list")
    assert refused.returncode == 2
    assert "merlin db upgrade" in refused.stderr
    upgraded = merlin(env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert [a["kind"] for a in view["steps"][0]["attempts"]] == ["execute", "fix", "escalate"]
    listing = json.loads(merlin(env, "list", "--json").stdout)
    assert [job["id"] for job in listing] == [view["id"]]
    assert not (tmp_path / "home" / "merlin.db").exists()


EXPENSIVE = """\
[[tiers]]
name = "local"
model = "scripted/local.yaml"
price_in = 1.0
price_out = 2.0

[[tiers]]
name = "premium"
model = "scripted/premium.yaml"
price_in = 3000.0
price_out = 15000.0
"""


def test_budget_stops_the_job_before_an_escalation_it_cannot_pay(
    tmp_path: Path, py_repo: Path
) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(
        tmp_path / "job", local=LOCAL_WRONG, premium=PREMIUM_RIGHT, tasklist=ONE_STEP
    )
    config.write_text(EXPENSIVE)
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config),
        "--budget", "0.01", "--json",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "budget_exceeded"
    assert view["budget_usd"] == 0.01
    assert "budget of $0.0100 reached: spent $" in view["error"]
    assert "escalating on tier 'premium'" in view["error"]
    attempts = view["steps"][0]["attempts"]
    assert [(a["kind"], a["tier"]) for a in attempts] == [("execute", "local"), ("fix", "local")]
    assert 0 < view["cost_usd"] <= 0.01  # the local calls were paid; no premium call was made


def test_run_quiet_prints_only_the_outcome_line(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    job_args = ["--repo", str(py_repo), "-q"]
    right = PREMIUM_RIGHT.replace("match: 'solve the step afresh'\n    turn", "turn")
    passing, config = write_job_files(tmp_path / "pass", local=right, tasklist=ONE_STEP)
    result = merlin(env, "run", str(passing), "--config", str(config), *job_args)
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"job (\w+) completed: branch merlin/\1\n", result.stdout)
    assert match, result.stdout  # no banner, no table, no patch line: the outcome alone
    failing, config = write_job_files(tmp_path / "fail", local="rules: []\n", tasklist=ONE_STEP)
    failed = merlin(env, "run", str(failing), "--config", str(config), *job_args)
    assert failed.returncode == 1, failed.stderr
    assert re.fullmatch(r"job \w+ failed: [^\n]+\n", failed.stdout), failed.stdout


def test_an_exit_command_runs_as_written_though_its_secret_is_stored_as_a_reference(
    tmp_path: Path, py_repo: Path
) -> None:
    """A secret's value in an exit command: the command sees it, the store never holds it."""
    secret = "sk-test-exitcommand-0123456789"
    env = merlin_env(tmp_path / "home", OPENAI_API_KEY=secret)
    checked = (
        f"title: Checked with a key\nsteps:\n  - id: fix\n    step_type: Debug\n"
        f"    description: answer() must return 42\n"
        f"    exit_command: sh -c 'test \"$0\" = {secret} && python -m pytest -q' {secret}\n"
    )
    right = PREMIUM_RIGHT.replace("solve the step afresh", "Step fix")
    tasklist, config = write_job_files(tmp_path / "job", local=right, tasklist=checked)
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "completed"
    assert secret not in result.stdout
    assert "${merlin-secret:OPENAI_API_KEY}" in view["steps"][0]["exit_command"]
    with sqlite3.connect(tmp_path / "home" / "merlin.db") as db:
        stored = db.execute("SELECT exit_command FROM steps").fetchone()[0]
    assert secret not in stored
