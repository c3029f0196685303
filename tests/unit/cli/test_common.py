"""Bad input to the real CLI: exit code 2, a clear message, and nothing enqueued or written."""

from __future__ import annotations

import sqlite3
import sys
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from tests.conftest import git, make_repo

GOOD_STEP = """\
  - id: fix
    step_type: Debug
    description: Make answer() return 42.
"""

MERLIN_TOML = '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n'


@dataclass
class Case:
    tasklist: str
    expected: tuple[str, ...]
    # "repo" (a good git repository), "plain" (a plain folder), "remote" (a file:// URL of
    # a bare clone of repo), "nowhere" (a file:// URL of nothing) or "password" (in the URL)
    repo: str = "repo"
    config: str | None = None  # text of a --config file, if any


CASES = {
    "malformed-yaml": Case(
        "title: x\nsteps:\n  - id: fix\n    description: [unclosed\n",
        ("malformed YAML", "line", "column"),
    ),
    "unknown-step-type": Case(
        "title: x\nsteps:\n  - id: fix\n    step_type: Debugg\n    description: d\n",
        ("steps[0]", "step_type"),
    ),
    "duplicate-step-ids": Case(
        "title: x\nsteps:\n" + GOOD_STEP + GOOD_STEP, ("duplicate step id 'fix'",)
    ),
    "depends-on-cycle": Case(
        "title: x\nsteps:\n"
        "  - {id: a, step_type: Debug, description: d, depends_on: [b]}\n"
        "  - {id: b, step_type: Debug, description: d, depends_on: [a]}\n",
        ("cycle",),
    ),
    "not-a-git-repository": Case(
        "title: x\nsteps:\n" + GOOD_STEP, ("not a git work tree", "plain"), repo="plain"
    ),
    "unknown-tier": Case(
        "title: x\nsteps:\n" + GOOD_STEP + "    tier: nope\n",
        ("unknown tier 'nope'", "configured tiers: local"),
    ),
    "missing-script": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("tier 'ghost'", "missing-script.yaml", "does not exist"),
        config='[[tiers]]\nname = "ghost"\nmodel = "scripted/missing-script.yaml"\n',
    ),
    "empty-steps": Case("title: Nothing to do\nsteps: []\n", ("no steps",)),
    "unreachable-url": Case(
        "title: x\nsteps:\n" + GOOD_STEP, ("cannot clone", "nowhere.git"), repo="nowhere"
    ),
    "password-in-url": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("carries credentials", "credential helper"),
        repo="password",
    ),
    "no-tier-has-credentials-or-server": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("no configured tier can be used", "ANTHROPIC_API_KEY", "127.0.0.1:9"),
        config=(
            '[[tiers]]\nname = "cheap"\nmodel = "ollama_chat/none"\n'
            '[[tiers]]\nname = "dear"\nmodel = "anthropic/claude-sonnet-4-5"\n'
        ),
    ),
    "model-without-provider": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("tiers.0.model", "'smollm2' names no provider", "openai/smollm2"),
        config='[[tiers]]\nname = "local"\nmodel = "smollm2"\n',
    ),
    "api-key-instead-of-its-variable": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("tiers.0.api_key_env", "pattern"),
        config='[[tiers]]\nname = "local"\nmodel = "openai/x"\napi_key_env = "sk-abc-123"\n',
    ),
    "unknown-sandbox-mode": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("sandbox.mode", "'bwrap' or 'none'"),
        config=MERLIN_TOML + '[sandbox]\nmode = "docker"\n',
    ),
    "secret-in-pass-env": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("pass_env", "OPENAI_API_KEY"),
        config=MERLIN_TOML + '[sandbox]\npass_env = ["OPENAI_API_KEY"]\n',
    ),
    "url-whose-merlin-toml-names-scripts-inside-it": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("scripted models by paths inside", "--config"),
        repo="remote",
    ),
    # Found by fuzzing (issue 16): each was a traceback with exit code 1.
    "scripted-path-of-an-unknown-user": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("tier model 'scripted/~nouser-xq/x.yaml' is not a usable path",),
        config='[[tiers]]\nname = "local"\nmodel = "scripted/~nouser-xq/x.yaml"\n',
    ),
    "scripted-path-with-a-nul-byte": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("is not a usable path",),
        config='[[tiers]]\nname = "local"\nmodel = "scripted/a\\u0000b.yaml"\n',
    ),
    "deeply-nested-tasklist": Case(
        "title: x\nsteps: " + "[" * 5000 + "]" * 5000 + "\n",
        ("nested too deeply",),
    ),
    "step-id-not-a-ref-name": Case(
        "title: x\nsteps:\n  - {id: a..b, step_type: Debug, description: d}\n"
        "  - {id: c.lock, step_type: Debug, description: d}\n",
        ("step id 'a..b' cannot be part of a git ref name", "'c.lock'"),
    ),
    "infinite-price": Case(
        "title: x\nsteps:\n" + GOOD_STEP,
        ("price_in", "finite"),
        config=MERLIN_TOML + "price_in = inf\n",
    ),
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A Python project with a scripted-only merlin.toml (no real model is ever needed)."""
    return make_repo(
        tmp_path / "repo",
        {
            "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
            "app.py": "def answer():\n    return 41\n",
            "merlin.toml": MERLIN_TOML,
            "local.yaml": "rules: []\n",
        },
    )


def squash(text: str) -> str:
    """The text without whitespace: rich may wrap long lines anywhere in a narrow console."""
    return "".join(text.split())


def job_rows(home: Path) -> int:
    db = home / "merlin.db"
    if not db.exists():
        return 0
    with closing(sqlite3.connect(db)) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] if "jobs" in tables else 0


def broker_dbs(home: Path) -> set[Path]:
    """$MERLIN_HOME/broker.db, and the broker the in-process Celery app really publishes to.

    workers.app builds its Celery app once, at import, from the MERLIN_HOME of that
    moment; later tests in the same process publish to that first broker.
    """
    paths = {home / "broker.db"}
    module = sys.modules.get("workers.app")
    if module is not None:
        url = str(module.app.conf.broker_url)
        if url.startswith("sqla+sqlite:///"):
            paths.add(Path(url.removeprefix("sqla+sqlite:///")))
    return paths


def broker_messages(home: Path) -> dict[Path, int]:
    counts = {}
    for db in broker_dbs(home):
        counts[db] = 0
        if not db.exists():
            continue
        with closing(sqlite3.connect(db)) as conn:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "kombu_message" in tables:
                counts[db] = conn.execute("SELECT COUNT(*) FROM kombu_message").fetchone()[0]
    return counts


def new_broker_messages(home: Path, before: dict[Path, int]) -> int:
    return sum(count - before.get(db, 0) for db, count in broker_messages(home).items())


def assert_nothing_written(home: Path, repo: Path, broker_before: dict[Path, int]) -> None:
    assert job_rows(home) == 0
    assert new_broker_messages(home, broker_before) == 0
    assert git(repo, "branch", "--list", "merlin/*") == ""
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("command", ["submit", "run"])
@pytest.mark.parametrize("case_name", list(CASES))
def test_bad_input_is_refused(
    command: str,
    case_name: str,
    merlin_home: Path,
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = CASES[case_name]
    monkeypatch.setenv("OLLAMA_API_BASE", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # git must not find an enclosing repository above the plain folder
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    tasklist = tmp_path / "tasklist.yaml"
    tasklist.write_text(case.tasklist)
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    target = {
        "repo": str(repo),
        "plain": str(tmp_path / "plain"),
        "remote": f"file://{bare}",
        "nowhere": f"file://{tmp_path / 'nowhere.git'}",
        "password": "https://bot:hunter2@example.com/org/repo.git",
    }[case.repo]
    (tmp_path / "plain").mkdir()
    args = [command, str(tasklist), "--repo", target]
    if case.config is not None:
        config = tmp_path / "conf" / "merlin.toml"
        config.parent.mkdir()
        config.write_text(case.config)
        args += ["--config", str(config)]

    broker_before = broker_messages(merlin_home)

    result = CliRunner().invoke(app, args)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    output = squash(result.output)
    assert "error:" in output
    for expected in case.expected:
        assert squash(expected) in output, result.output
    assert "hunter2" not in output
    assert_nothing_written(merlin_home, repo, broker_before)
    assert git(bare, "branch", "--list", "merlin/*") == ""


def test_status_of_unknown_job(merlin_home: Path) -> None:
    result = CliRunner().invoke(app, ["status", "nosuchjob"])
    assert result.exit_code == 2, result.output
    assert "no job with id 'nosuchjob'" in " ".join(result.output.split())
    assert job_rows(merlin_home) == 0


def test_valid_submit_is_detected_by_the_same_checks(
    merlin_home: Path, repo: Path, tmp_path: Path
) -> None:
    # control: the checks above do see a job, its branch and its queued message
    tasklist = tmp_path / "tasklist.yaml"
    tasklist.write_text("title: ok\nsteps:\n" + GOOD_STEP)
    broker_before = broker_messages(merlin_home)
    result = CliRunner().invoke(app, ["submit", str(tasklist), "--repo", str(repo)])
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_rows(merlin_home) == 1
    assert git(repo, "branch", "--list", "merlin/*").strip("* ") == f"merlin/{job_id}"
    assert new_broker_messages(merlin_home, broker_before) >= 1


def _cut(*_: object) -> None:
    from sqlalchemy.exc import OperationalError

    raise OperationalError("SELECT", {}, Exception("server closed the connection\nunexpectedly"))


def test_a_submit_whose_publishing_is_cut_still_gives_its_recorded_job(
    merlin_home: Path, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recorded, then an outage stops the publishing: the job exists (a worker's sweep
    # publishes it), so the command prints its id, with a warning, and succeeds.
    import workers.canvas

    monkeypatch.setattr(workers.canvas, "enqueue_job", _cut)
    tasklist = tmp_path / "tasklist.yaml"
    tasklist.write_text("title: ok\nsteps:\n" + GOOD_STEP)
    result = CliRunner().invoke(app, ["submit", str(tasklist), "--repo", str(repo)])
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_rows(merlin_home) == 1
    warning = " ".join(result.stderr.split())
    assert f"job {job_id} is recorded, but its tasks could not be published" in warning
    assert "server closed the connection)" in warning
    assert "recovery sweep will publish them" in warning


def test_a_database_error_is_one_line_not_a_traceback(
    merlin_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import merlin_flow.jobs.views

    monkeypatch.setattr(merlin_flow.jobs.views, "job_view", _cut)
    result = CliRunner().invoke(app, ["status", "abc", "--json"])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == "error: the database failed: server closed the connection"
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["costs"], "give a JOB id or --since"),
        (["costs", "abc", "--since", "7d"], "give a JOB id or --since"),
        (["costs", "--since", "soon"], "use a number and m, h, d or w"),
        (["costs", "nosuchjob"], "no job with id 'nosuchjob'"),
        (["run", "x.yaml", "--budget", "0"], "--budget must be more than 0"),
        (["submit", "x.yaml", "--junit", "j.xml"], "--junit and --patch are written when"),
        (["submit", "x.yaml", "--patch", "p.diff"], "add --wait"),
        (["cancel", "nosuchjob"], "no job with id 'nosuchjob'"),
        (["resume", "nosuchjob"], "no job with id 'nosuchjob'"),
        (["replay", "nosuchjob"], "no job with id 'nosuchjob'"),
        (["resume", "x", "--budget", "-1"], "--budget must be more than 0"),
        (["run", "x.yaml", "--junit", "."], "is a directory; give a file name"),
        (
            ["submit", "x.yaml", "--wait", "--patch", "/etc/hostname/y.diff"],
            "not a writable folder",
        ),
    ],
)
def test_costs_and_budget_bad_input(merlin_home: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_costs_since_with_no_jobs(merlin_home: Path) -> None:
    import json

    result = CliRunner().invoke(app, ["costs", "--since", "7d", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["jobs"], report["total"]["calls"], report["tiers"]) == (0, 0, [])


def test_worker_refuses_to_start_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    import merlin_flow.workspace.sandbox

    monkeypatch.setattr(
        merlin_flow.workspace.sandbox, "sandbox_problem", lambda: "bwrap is not here"
    )
    started: list[list[str]] = []
    import workers.app

    monkeypatch.setattr(workers.app.app, "worker_main", started.append)
    refused = CliRunner().invoke(app, ["worker"])
    assert refused.exit_code == 2, refused.output
    assert "bwrap is not here" in refused.output
    assert started == []
    allowed = CliRunner().invoke(app, ["worker", "--sandbox", "none"])
    assert allowed.exit_code == 0, allowed.output
    assert "no sandbox" in allowed.output
    assert len(started) == 1


def test_run_refuses_when_the_sandbox_cannot_run_here(
    merlin_home: Path, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import merlin_flow.workspace.sandbox

    monkeypatch.setattr(
        merlin_flow.workspace.sandbox, "sandbox_problem", lambda: "bwrap is not here"
    )
    tasklist = tmp_path / "tasklist.yaml"
    tasklist.write_text("title: x\nsteps:\n" + GOOD_STEP)
    before = broker_messages(merlin_home)
    result = CliRunner().invoke(app, ["run", str(tasklist), "--repo", str(repo)])
    assert result.exit_code == 2, result.output
    assert "bwrap is not here" in result.output
    assert_nothing_written(merlin_home, repo, before)
