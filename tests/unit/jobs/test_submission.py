"""submit_job, the library's one way in: every check holds for a library caller too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from merlin_flow.errors import ConfigError, InputError
from merlin_flow.jobs.submission import submit_job
from merlin_flow.settings import Settings
from merlin_flow.store import Database, Job, JobStatus
from merlin_flow.tasklist import parse_tasklist
from tests.conftest import git, make_repo

TASKLIST = {"title": "t", "steps": [{"id": "fix", "step_type": "Debug", "description": "42"}]}


def _jobs(db: Database) -> int:
    with db.reader() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def _job_files(folder: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A merlin.toml (one scripted tier, its script in ``tmp_path``) and a TaskList file."""
    script = tmp_path / "local.yaml"
    script.write_text("rules: []\n")
    config = folder / "merlin.toml"
    config.write_text(f'[[tiers]]\nname = "local"\nmodel = "scripted/{script}"\n')
    tasklist = folder / "tasklist.yaml"
    tasklist.write_text("title: t\nsteps:\n  - {id: fix, step_type: Debug, description: d}\n")
    return config, tasklist


def _repo_with_scripted_config(tmp_path: Path) -> Path:
    """A repository whose merlin.toml names a script inside it, and its bare clone."""
    repo = make_repo(
        tmp_path / "repo",
        {
            "app.py": "def answer():\n    return 41\n",
            "local.yaml": "rules: []\n",
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n',
        },
    )
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    return bare


def test_a_git_url_whose_config_names_scripts_inside_it_is_refused(
    db: Database, settings: Settings, tmp_path: Path
) -> None:
    bare = _repo_with_scripted_config(tmp_path)
    with pytest.raises(ConfigError, match="give --config"):
        submit_job(db, settings, parse_tasklist(TASKLIST), f"file://{bare}")
    assert _jobs(db) == 0
    assert git(bare, "branch", "--list", "merlin/*") == ""


def test_a_budget_of_nothing_is_refused_before_anything_is_read(
    db: Database, settings: Settings, py_repo: Path
) -> None:
    with pytest.raises(InputError, match="--budget must be more than 0 USD"):
        submit_job(db, settings, parse_tasklist(TASKLIST), str(py_repo), budget_usd=0.0)
    assert _jobs(db) == 0
    assert git(py_repo, "branch", "--list", "merlin/*") == ""


def test_a_tasklist_file_and_a_repository_make_a_pending_job(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, tasklist = _job_files(tmp_path, tmp_path)

    submission = submit_job(db, settings, tasklist, str(py_repo), config, budget_usd=1.0)

    assert submission.config.tiers[0].name == "local"
    with db.reader() as session:
        job = session.get_one(Job, submission.job_id)
        assert (job.status, job.budget_usd, len(job.steps)) == (JobStatus.PENDING, 1.0, 1)
        assert job.steps[0].exit_command == "python -m pytest -q"  # found the project kind
    assert git(py_repo, "branch", "--list", f"merlin/{submission.job_id}").strip()


def test_uncommitted_changes_are_named_as_left_out(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, _ = _job_files(tmp_path, tmp_path)
    tasklist = parse_tasklist(TASKLIST)
    clean = submit_job(db, settings, tasklist, str(py_repo), config)
    assert clean.warnings == ()
    (py_repo / "app.py").write_text("def answer():\n    return 42\n")
    (py_repo / "notes.txt").write_text("new\n")
    dirty = submit_job(db, settings, tasklist, str(py_repo), config)
    head = git(py_repo, "rev-parse", "HEAD")[:10]
    (warning,) = dirty.warnings
    assert "uncommitted changes (app.py, notes.txt)" in warning
    assert f"starts from HEAD {head} without them" in warning


def test_the_tasklist_and_config_files_themselves_are_not_warned_about(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    config, tasklist = _job_files(py_repo, tmp_path)
    assert submit_job(db, settings, tasklist, str(py_repo), config).warnings == ()


@contextlib.contextmanager
def _cut_at_first_flush() -> Iterator[list[int]]:
    """At the first flush of any session, Postgres terminates that session's backend (an
    outage): its COMMIT then fails with a lost connection. Yields the pids it cut."""
    from sqlalchemy import create_engine, event, text
    from sqlalchemy.orm import Session

    from tests.conftest import POSTGRES_ADMIN_URL

    cut: list[int] = []

    def cut_once(session: Session, _context: object) -> None:
        if cut:
            return
        pid = session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        admin.dispose()
        cut.append(pid)

    event.listen(Session, "after_flush", cut_once)
    try:
        yield cut
    finally:
        event.remove(Session, "after_flush", cut_once)


def test_a_submit_whose_connection_is_cut_is_recorded_once(
    postgres_url: str, settings: Settings, py_repo: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from merlin_flow.store import database, open_database, upgrade

    fresh = Database(postgres_url)
    upgrade(fresh)
    fresh.dispose()
    db = open_database(postgres_url)
    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    config, tasklist = _job_files(tmp_path, tmp_path)
    with _cut_at_first_flush() as cut:
        job_id = submit_job(db, settings, tasklist, str(py_repo), config).job_id
    assert len(cut) == 1  # the first try's session was cut before its commit
    assert _jobs(db) == 1
    assert git(py_repo, "branch", "--list", f"merlin/{job_id}").strip()
    db.dispose()


def test_a_write_whose_commit_landed_unseen_is_not_done_again(db: Database) -> None:
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from merlin_flow.store import database

    tries: list[int] = []

    def write(session: Session) -> None:
        tries.append(1)
        with db.session() as other:  # the commit lands...
            base = "0" * 40
            other.add(
                Job(id="landed", title="t", repo="r", status=JobStatus.PENDING, branch="b",
                    base_commit=base, head_commit=base, tasklist={}, config={})
            )  # fmt: skip
        lost = Exception("server closed the connection unexpectedly")
        raise OperationalError("COMMIT", {}, lost)  # ...and its answer is lost

    database.write_patiently(db, write, lambda s: s.get(Job, "landed") is not None, "job landed")
    assert (len(tries), _jobs(db)) == (1, 1)


def test_a_write_cut_every_time_says_the_database_cannot_be_used(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from merlin_flow.errors import StoreError
    from merlin_flow.store import database

    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    tries: list[int] = []

    def write(session: Session) -> None:
        tries.append(1)
        raise OperationalError("INSERT", {}, Exception("server closed the connection"))

    with pytest.raises(StoreError, match=r"cannot use the database .* lost 4 times in a row"):
        database.write_patiently(db, write, lambda session: False, "job x")
    assert len(tries) == 4


def _lost(statement: str) -> Exception:
    from sqlalchemy.exc import OperationalError

    return OperationalError(statement, {}, Exception("server closed the connection"))


def test_a_write_whose_every_look_is_cut_is_in_doubt_and_never_written_twice(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.orm import Session

    from merlin_flow.errors import RecordInDoubt
    from merlin_flow.store import database

    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    writes, looks = [], []

    def write(session: Session) -> None:
        writes.append(1)
        raise _lost("COMMIT")

    def landed(session: Session) -> bool:
        looks.append(1)
        raise _lost("SELECT")

    with pytest.raises(RecordInDoubt, match="not known whether it was") as caught:
        database.write_patiently(db, write, landed, "job abc")
    assert "job abc" in str(caught.value)
    assert (len(writes), len(looks)) == (1, 4)  # looked again and again, never wrote again


def test_a_commit_that_lands_late_is_taken_for_landed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut; a look finds nothing; the retry then collides with the first commit, which
    # landed meanwhile (a duplicate key): it landed, the retry's error is not raised.
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import Session

    from merlin_flow.store import database

    monkeypatch.setattr(database, "OPEN_RETRY_DELAYS", (0.0, 0.0, 0.0))
    answers = [False, True]
    looks: list[bool] = []

    def write(session: Session) -> None:
        if not looks:
            raise _lost("COMMIT")
        raise IntegrityError("INSERT", {}, Exception("duplicate key value"))

    def landed(session: Session) -> bool:
        looks.append(answers[len(looks)])
        return looks[-1]

    database.write_patiently(db, write, landed, "job abc")
    assert looks == [False, True]


@pytest.mark.parametrize(
    ("step", "toml", "refused"),
    [
        (
            ", exit_command: 'pytest -q && ruff check .'",
            "",
            r"step fix: its exit command `pytest -q && ruff check \.` uses shell syntax \(`&&`\)",
        ),
        (
            "",
            '[exit_commands]\nDebug = "echo failed; exit 1"\n',
            r"\[exit_commands\] Debug in .*merlin.toml: `echo failed; exit 1` uses shell syntax",
        ),
        (", exit_command: 'pytest -q && ruff check .'", "shell = true\n", None),
    ],
    ids=["a step's own", "the [exit_commands] default", "with shell = true"],
)
def test_an_exit_command_in_shell_syntax_runs_with_a_shell_or_is_refused(
    db: Database,
    settings: Settings,
    py_repo: Path,
    tmp_path: Path,
    step: str,
    toml: str,
    refused: str | None,
) -> None:
    config, tasklist = _job_files(tmp_path, tmp_path)
    config.write_text(toml + config.read_text())
    tasklist.write_text(
        f"title: t\nsteps:\n  - {{id: fix, step_type: Debug, description: d{step}}}\n"
    )
    if refused is None:
        assert submit_job(db, settings, tasklist, str(py_repo), config).job_id
        return
    with pytest.raises(ConfigError, match=refused) as error:
        submit_job(db, settings, tasklist, str(py_repo), config)
    assert "set it (exit commands then run with /bin/sh -c" in str(error.value)
    assert error.value.exit_code == 2
    assert _jobs(db) == 0


def test_each_step_records_where_it_starts_and_who_chose_it(
    db: Database, settings: Settings, py_repo: Path, tmp_path: Path
) -> None:
    from merlin_flow.agents.choice import AgentChoice
    from merlin_flow.agents.definitions import AgentDefinition, AgentScope
    from merlin_flow.config import MerlinConfig, Tier
    from merlin_flow.jobs.submission import create_job
    from merlin_flow.store import Step

    config = MerlinConfig(
        tiers=[Tier(name="local", model="scripted/a.yaml"), Tier(name="big", model="x/big")]
    )
    reviewer = AgentDefinition(
        name="reviewer", description="reviews", prompt="review", tools=None, tier="big",
        model=None, memory=None, scope=AgentScope.PROJECT, file="reviewer.md",
    )  # fmt: skip
    tasklist = parse_tasklist({"title": "t", "steps": [
        {"id": "a", "step_type": "Debug", "description": "fix it"},
        {"id": "b", "step_type": "Verify", "description": "review it"},
        {"id": "c", "step_type": "Test", "description": "test it", "tier": "big"},
    ]})  # fmt: skip
    agents = [AgentChoice(None), AgentChoice(reviewer, "named"), AgentChoice(None)]
    job_id = create_job(db, settings, tasklist, py_repo, config, agents=agents)
    with db.reader() as session:
        steps = session.scalars(select(Step).where(Step.job_id == job_id)).all()
        routes = {step.key: (step.tier_index, step.route) for step in steps}
    assert {key: (tier, route["by"], route["tier"]) for key, (tier, route) in routes.items()} == {
        "a": (0, "rules", "local"),
        "b": (1, "agent", "big"),
        "c": (1, "step", "big"),
    }
    assert routes["a"][1]["learn_after"] == 3.0
