"""Shared fixtures: an isolated MERLIN_HOME per test and throwaway git repositories."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Code that reads the settings before a test sets MERLIN_HOME (workers.app builds its
# Celery app at import) gets a home of this process's own: never the user's ~/.merlin,
# MERLIN_HOME, database or broker.
os.environ["MERLIN_HOME"] = tempfile.mkdtemp(prefix="merlin-tests-home-")
atexit.register(shutil.rmtree, os.environ["MERLIN_HOME"], ignore_errors=True)
for own in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL", "MERLIN_CONFIG"):
    os.environ.pop(own, None)
# This machine's own /etc/merlin/merlin.toml is not the tests' business: a test that wants
# a system file sets MERLIN_SYSTEM_CONFIG itself.
os.environ["MERLIN_SYSTEM_CONFIG"] = os.path.join(os.environ["MERLIN_HOME"], "etc-merlin.toml")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist gives its workers the terminal's size; the tests (and the merlin processes
    # they start) print as they would without it, unwrapped when not on a terminal.
    for size in ("COLUMNS", "LINES"):
        os.environ.pop(size, None)

E2E = Path(__file__).parent / "e2e"
BESIDE = frozenset(
    {
        "test_run.py", "test_docs_scripted_model.py", "test_docs_agents.py", "test_kinds.py",
        "test_environment.py", "test_requests.py", "test_agents.py", "test_agents_run.py",
        "test_hostile_output.py", "test_escape.py", "test_model_access.py",
        "test_model_servers.py", "test_rabbitmq.py", "test_wheel.py", "test_image_commands.py",
        "test_github.py", "test_workflow_steps.py", "test_dashboard.py",
    }
)  # fmt: skip
"""End-to-end tests that time nothing and kill no worker: they may share the machine."""
LAST = frozenset(
    {
        "test_chaos.py", "test_disk_full.py", "test_prefetch_loss.py", "test_orphan_commands.py",
        "test_cancel_stops.py", "test_connection_loss.py", "test_worker.py", "test_interrupt.py",
    }
)  # fmt: skip
"""Tests that kill workers and time what follows: last, once the machine is quieter."""
BENCHMARKS_BESIDE = frozenset(
    {"broker_poll", "cli_startup", "dag", "memory", "planning", "sandbox"}
)
"""The benchmarks whose smoke runs (``tests/e2e/test_benchmarks.py``) go with ``BESIDE``:
about half of their time; the others run with the rest."""


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The end-to-end tests in two runs of their own, one per xdist process.

    They start worker processes, so each run takes them one at a time: the tests that
    share the machine well (``BESIDE``) on one process, then its share of the unit tests;
    the others on the other process, those that time what a killed worker leaves
    (``LAST``) last, when the first run is over. xdist's own ``loadgroup`` cannot say
    so here: pytest 9 no longer calls the worker hook that gives grouped tests their ids.
    """
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndApart(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if not nodeid.startswith("tests/e2e/"):
                return nodeid
            name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            if name == "test_benchmarks.py":  # the smoke runs time nothing they assert
                bench = nodeid.rsplit("[", 1)[-1].rstrip("]")
                return "e2e-beside" if bench in BENCHMARKS_BESIDE else "e2e"
            return "e2e-beside" if name in BESIDE else "e2e"

    return EndToEndApart(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that time what a killed worker leaves come last."""
    items.sort(key=lambda item: item.path.name in LAST)


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity; return stdout."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def require_bwrap() -> None:
    """Skip the calling test without a working bubblewrap here; in CI, fail it."""
    from merlin_flow.workspace.sandbox import sandbox_problem

    problem = sandbox_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"bubblewrap is required in CI: {problem}")
        pytest.skip(problem)


def make_repo(path: Path, files: dict[str, str]) -> Path:
    """Create a git repository at ``path`` with ``files`` committed on branch main."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture(scope="session", autouse=True)
def _shared_uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One uv package cache for the whole run: environments download each package once.

    Set in os.environ, so the merlin processes that end-to-end tests start inherit it.
    """
    previous = os.environ.get("MERLIN_UV_CACHE_DIR")
    os.environ["MERLIN_UV_CACHE_DIR"] = str(tmp_path_factory.mktemp("uv-cache"))
    yield
    if previous is None:
        os.environ.pop("MERLIN_UV_CACHE_DIR", None)
    else:
        os.environ["MERLIN_UV_CACHE_DIR"] = previous


@pytest.fixture
def merlin_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty MERLIN_HOME for this test, with embedded database and broker."""
    home = tmp_path / "merlin-home"
    monkeypatch.setenv("MERLIN_HOME", str(home))
    monkeypatch.delenv("MERLIN_DATABASE_URL", raising=False)
    monkeypatch.delenv("MERLIN_BROKER_URL", raising=False)
    return home


@pytest.fixture
def py_repo(tmp_path: Path) -> Path:
    """A small Python project in a git repository (project kind: python)."""
    return make_repo(
        tmp_path / "repo",
        {
            "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
            "app.py": "def answer():\n    return 41\n",
            "test_app.py": (
                "from app import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
            ),
        },
    )


POSTGRES_ADMIN_URL = os.environ.get(
    "MERLIN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _postgres_database() -> Iterator[str]:
    """A fresh Postgres database for one test; skipped locally, a failure in CI."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"merlin_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        if os.environ.get("CI"):
            pytest.fail(f"Postgres is required in CI but unreachable: {exc}")
        pytest.skip(f"Postgres unreachable: {exc}")
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on the embedded SQLite database and on a real Postgres."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'merlin.db'}"
    else:
        yield from _postgres_database()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty Postgres database."""
    yield from _postgres_database()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The base URL of the tests' own Redis server (tests/redis_server.py); None if none."""
    from tests.redis_server import NoRedisServer, own_redis_server

    try:
        with own_redis_server(tmp_path_factory.mktemp("redis")) as url:
            yield url
    except NoRedisServer as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required in CI: {exc}")
        yield None


@pytest.fixture
def redis_url(redis_server: str | None) -> Iterator[str]:
    """An empty database (one of 1-15) of the tests' own Redis server, flushed after."""
    import random

    import redis

    if redis_server is None:
        pytest.skip("no Redis for the tests: install redis-server or set MERLIN_TEST_REDIS_URL")
    url = f"{redis_server}/{random.randint(1, 15)}"
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        client.close()
        if os.environ.get("CI"):
            pytest.fail(f"Redis is required in CI but unreachable at {url}: {exc}")
        pytest.skip(f"Redis unreachable at {url}: {exc}")
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
