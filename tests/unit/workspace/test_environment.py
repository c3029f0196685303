"""The project's environment: its plan by project kind, its cache key, one build per key."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Environment
from merlin_flow.workspace.checkout import confine
from merlin_flow.workspace.environment import (
    MARKER_FILE,
    ensure_environment,
    plan_environment,
)
from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.sandbox import run_confined
from tests.conftest import git, make_repo, require_bwrap

HATCH_PROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pkg"
version = "0.1"

[project.optional-dependencies]
test = ["pytest"]
docs = ["sphinx"]
"""

COUNTING_SETUP = ['echo run >> "$MERLIN_ENV/runs"', "cp -r /workspace/src $MERLIN_ENV/src"]


def config(setup: list[str] | None = None, cache_key: list[str] | None = None) -> MerlinConfig:
    return MerlinConfig(
        tiers=[Tier(name="t", model="scripted/none.yaml")],
        environment=Environment(setup=setup, cache_key=cache_key),
    )


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def commit(repo: Path, files: dict[str, str]) -> str:
    for name, content in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(content)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    return head(repo)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", uv_cache_dir=tmp_path / "uv-cache")


@pytest.fixture
def src_repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {"pyproject.toml": HATCH_PROJECT, "src/pkg/__init__.py": "VALUE = 1\n"},
    )


@pytest.fixture
def needs_bwrap() -> None:
    require_bwrap()


def test_default_python_setup_installs_the_project_editable_with_test_extras(
    src_repo: Path,
) -> None:
    plan = plan_environment(src_repo, head(src_repo), config())
    assert plan.kind is ProjectKind.PYTHON
    assert plan.default
    assert plan.setup[0].startswith("uv venv ")
    assert plan.setup[1] == "uv pip install --quiet -e '.[test]' pytest"


def test_a_project_that_is_not_installable_gets_its_requirements(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "flat",
        {
            "pyproject.toml": '[project]\nname = "x"\nversion = "0"\ndependencies = ["attrs"]\n',
            "requirements-test.txt": "hypothesis\n",
            "app.py": "",
        },
    )
    plan = plan_environment(repo, head(repo), config())
    assert (
        plan.setup[1] == "uv pip install --quiet -r pyproject.toml -r requirements-test.txt pytest"
    )


def test_configured_setup_is_taken_as_written_and_empty_means_none(src_repo: Path) -> None:
    plan = plan_environment(src_repo, head(src_repo), config(setup=["make env"]))
    assert plan.setup == ["make env"]
    assert not plan.default
    assert not plan_environment(src_repo, head(src_repo), config(setup=[])).needed


def test_every_kind_at_the_root_gets_its_default_setup(tmp_path: Path) -> None:
    """A mixed repository (a Python service with a Node front end) gets both, in order."""
    repo = make_repo(
        tmp_path / "mixed",
        {"pyproject.toml": HATCH_PROJECT, "package.json": "{}", "package-lock.json": "{}"},
    )
    plan = plan_environment(repo, head(repo), config())
    assert (plan.kind, plan.kinds) == (ProjectKind.PYTHON, (ProjectKind.PYTHON, ProjectKind.NODE))
    assert plan.setup[0].startswith("uv venv ")
    assert plan.setup[-1] == 'npm ci && mv node_modules "$MERLIN_ENV/node_modules"'


def test_the_key_follows_the_cache_key_files_only(src_repo: Path) -> None:
    first = plan_environment(src_repo, head(src_repo), config()).key
    code_change = commit(src_repo, {"src/pkg/__init__.py": "VALUE = 2\n"})
    assert plan_environment(src_repo, code_change, config()).key == first
    dependency_change = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# more\n"})
    assert plan_environment(src_repo, dependency_change, config()).key != first
    glob = config(cache_key=["*.lock"])
    before = plan_environment(src_repo, head(src_repo), glob).key
    locked = commit(src_repo, {"deps.lock": "a==1\n"})
    assert plan_environment(src_repo, locked, glob).key != before


def test_the_key_files_are_read_in_one_git_process_as_rev_parse_would(src_repo: Path) -> None:
    from merlin_flow.workspace.environment import _key_files
    from merlin_flow.workspace.git import git

    wanted = ["pyproject.toml", "src/pkg/__init__.py", "src", "missing.txt", "a b ü.txt"]
    commit(src_repo, {"a b ü.txt": "odd name\n"})
    found = _key_files(src_repo, head(src_repo), wanted, set())
    for path in [*wanted[:3], wanted[4]]:
        assert found[path] == git("rev-parse", f"HEAD:{path}", cwd=src_repo)
    assert found["missing.txt"] is None
    assert list(found) == sorted(wanted)


def test_setup_runs_once_per_key_and_is_reused(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=COUNTING_SETUP)
    first = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    assert first is not None
    assert first.built
    again = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    assert again is not None
    assert not again.built
    assert again.path == first.path
    assert (first.path / "runs").read_text() == "run\n"
    assert (first.path / MARKER_FILE).is_file()


def test_concurrent_builds_of_one_key_run_setup_once(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=["sleep 0.5", *COUNTING_SETUP])
    results = []

    def build() -> None:
        results.append(ensure_environment(settings, cfg, src_repo, head(src_repo), "repo"))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(1 for r in results if r is not None and r.built) == 1
    path = results[0].path if results[0] else None
    assert path is not None
    assert (path / "runs").read_text() == "run\n"


def test_a_failed_setup_names_the_command_shows_its_output_and_keeps_nothing(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=["echo building", "echo 'no such package: frobnicate' >&2; exit 3"])
    with pytest.raises(SetupFailed) as failure:
        ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    message = str(failure.value)
    assert "exited with code 3" in message
    assert "no such package: frobnicate" in message
    assert [p for p in settings.envs_dir.iterdir() if p.is_dir()] == []
    assert list((settings.worktrees_dir / "_setup").iterdir()) == []


def test_setup_sees_the_project_at_workspace_and_steps_see_their_own_worktree(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None
) -> None:
    """An install made by setup against /workspace resolves to each attempt's worktree."""
    cfg = config(setup=['mkdir -p "$MERLIN_ENV/bin"', "ln -s /workspace/src $MERLIN_ENV/code"])
    env = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    worktree = tmp_path / "attempt"
    worktree.mkdir()
    (worktree / "src").mkdir()
    (worktree / "src" / "marker").write_text("the attempt's code\n")
    box = confine(worktree, env, cfg)
    result = run_confined(["/bin/sh", "-c", "cat $MERLIN_ENV/code/marker"], box, cfg.sandbox, 10)
    assert result.output_tail == "the attempt's code\n"


def test_a_build_for_dependency_files_a_step_changed_gets_no_network(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    """A build hook a step added reaches nothing, unless a --config file allows it."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]
    reach = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" "
        '&& touch "$MERLIN_ENV/reached"'
    )
    cfg = config(setup=[reach])
    base = head(src_repo)
    built = ensure_environment(settings, cfg, src_repo, base, "repo", trusted=base)
    assert built is not None
    assert (built.path / "reached").is_file()  # the user's own dependency files: network
    listener.accept()[0].close()

    hooked = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# a build hook\n"})
    with pytest.raises(SetupFailed) as refused:
        ensure_environment(settings, cfg, src_repo, hooked, "repo", trusted=base)
    assert "ran without the network" in str(refused.value)
    assert "attempt_network = true" in str(refused.value)
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing came

    allowed = config(setup=[reach])
    allowed.environment.attempt_network = True
    again = ensure_environment(settings, allowed, src_repo, hooked, "repo", trusted=base)
    assert again is not None
    assert (again.path / "reached").is_file()
    listener.close()


def test_a_repositorys_own_config_cannot_give_such_builds_the_network(tmp_path: Path) -> None:
    from merlin_flow.config import load_config
    from merlin_flow.errors import ConfigError

    repo = make_repo(tmp_path / "repo", {"merlin.toml": "[environment]\nattempt_network = true\n"})
    with pytest.raises(ConfigError, match=r"\[environment\] attempt_network"):
        load_config(repo)
    own = tmp_path / "mine.toml"
    own.write_text("[environment]\nattempt_network = true\n")
    assert load_config(repo, own).environment.attempt_network
