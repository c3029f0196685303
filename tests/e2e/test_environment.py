"""A src-layout project installed editable by the default setup, verified on the attempt's code.

The project's tests import a package merlin does not depend on (``inflection``), so they
pass only in the project's own environment (built by uv from its test extra, with the
network, once). A correct change passes; a change that breaks the tests fails
verification and escalates, which it could not if the editable install resolved to the
user's unchanged checkout. The user's checkout is untouched, and the second job reuses
the first job's environment.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.settings import Settings
from merlin_flow.workspace.checkout import confine
from merlin_flow.workspace.environment import ensure_environment
from merlin_flow.workspace.network import outbound_problem
from merlin_flow.workspace.sandbox import run_confined
from tests.conftest import git, make_repo, require_bwrap
from tests.e2e.helpers import merlin, merlin_env, one_step, write_job_files

pytestmark = pytest.mark.e2e

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "slugkit"
version = "0.1.0"
requires-python = ">=3.9"

[project.optional-dependencies]
test = ["pytest", "inflection"]
"""
INIT = 'def shout(text):\n    return text.upper() + "!"\n'
TESTS = """\
import inflection

from slugkit import shout


def test_shout():
    assert shout("hi") == "HI!"


def test_shout_of_a_title():
    assert shout(inflection.titleize("hello_world")) == "HELLO WORLD!"
"""
WHISPER_TEST = """\
import inflection

from slugkit.whisper import whisper


def test_whisper():
    assert whisper(inflection.humanize("LOUD_VOICE")) == "loud voice..."
"""
LOCAL = """\
rules:
  - match: 'Step whisper \\('
    turn: 0
    reply:
      tool_calls:
        - name: write_file
          arguments:
            path: src/slugkit/whisper.py
            content: "def whisper(text):\\n    return text.lower() + '...'\\n"
        - name: write_file
          arguments: {path: tests/test_whisper.py, content: WHISPER_TEST}
        - name: run_command
          arguments:
            command: "python -c 'import inflection, slugkit; print(\\"FROM\\", slugkit.__file__)'"
  - match: 'Step whisper \\('
    reply: {content: "whisper() added"}
  - match: 'Step break \\('
    turn: 0
    reply:
      tool_calls:
        - name: edit_file
          arguments: {path: src/slugkit/__init__.py, old: 'return text.upper() + "!"',
                      new: 'return b""'}
  - match: 'Step break \\('
    reply: {content: "simplified shout()"}
"""


def test_default_setup_editable_install_tests_the_attempts_code(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "slugkit",
        {
            "pyproject.toml": PYPROJECT,
            "src/slugkit/__init__.py": INIT,
            "tests/test_shout.py": TESTS,
        },
    )
    head = git(repo, "rev-parse", "HEAD")
    home = tmp_path / "home"
    env = merlin_env(home)
    local = LOCAL.replace("WHISPER_TEST", json.dumps(WHISPER_TEST))
    _, config = write_job_files(tmp_path / "job", local=local, premium=local)

    good = one_step(tmp_path / "good.yaml", "whisper", "add slugkit.whisper.whisper() with a test")
    result = merlin(env, "run", str(good), "--repo", str(repo), "--config", str(config), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "completed"
    logs = merlin(env, "logs", view["id"], "--step", "whisper").stdout
    assert "FROM /workspace/src/slugkit/__init__.py" in logs  # the attempt's own code

    bad = one_step(tmp_path / "bad.yaml", "break", "simplify shout()")
    result = merlin(env, "run", str(bad), "--repo", str(repo), "--config", str(config), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "failed"
    (step,) = view["steps"]
    attempts = [(a["kind"], a["tier"], a["exit_code"]) for a in step["attempts"]]
    assert attempts[0] == ("execute", "local", 1)
    assert ("escalate", "premium", 1) in attempts

    # One environment for both jobs: setup ran once.
    with sqlite3.connect(home / "merlin.db") as conn:
        built = conn.execute("SELECT count(*) FROM events WHERE kind = 'environment_built'")
        assert built.fetchone()[0] == 1
    envs = [p for p in (home / "envs").iterdir() if p.is_dir()]
    assert len(envs) == 1

    # The user's checkout: same HEAD, same files, nothing new.
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "src/slugkit/__init__.py").read_text() == INIT


def test_a_failing_setup_fails_the_job_once_with_its_output(tmp_path: Path, py_repo: Path) -> None:
    env = merlin_env(tmp_path / "home")
    tasklist, config = write_job_files(tmp_path / "job")
    with config.open("a") as handle:
        handle.write(
            "\n[environment]\nsetup = [\"echo resolving; echo 'no matching distribution: frob' >&2;"
            ' exit 3"]\n'
        )
    result = merlin(
        env, "run", str(tasklist), "--repo", str(py_repo), "--config", str(config), "--json"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    view = json.loads(result.stdout)
    assert view["status"] == "failed"
    assert "environment setup failed" in view["error"]
    assert "no matching distribution: frob" in view["error"]
    first, *rest = view["steps"]
    assert len(first["attempts"]) == 1  # the job failed once, not once per attempt
    assert all(step["status"] == "Skipped" for step in rest)
    assert not [p for p in (tmp_path / "home" / "envs").iterdir() if p.is_dir()]


HOOKED_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "hooked"
version = "0.1.0"
dependencies = ["iniconfig"]

[tool.hatch.build.targets.wheel]
packages = ["src/hooked"]

[tool.hatch.build.hooks.custom]
"""
HOOK = """\
import os
import socket

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TARGETS = TARGETS_HERE


class CallHome(BuildHookInterface):
    def initialize(self, version, build_data):
        found = []
        for host, port in TARGETS:
            try:
                socket.create_connection((host, port), timeout=3).close()
                found.append(f"{host}:{port} reached")
            except OSError as exc:
                found.append(f"{host}:{port} refused ({type(exc).__name__})")
        with open(os.path.join(os.environ["MERLIN_ENV"], "hook.txt"), "a") as out:
            out.write("\\n".join(found) + "\\n")
"""


def test_an_install_hook_a_model_wrote_reaches_no_service_beside_the_worker(
    tmp_path: Path,
) -> None:
    """A later job's setup of the base commit runs a merged build hook: outbound only.

    The hook (hatchling's custom build hook, run by uv's editable install) tries the
    host's 127.0.0.1 and its 0.0.0.0 listeners; the project's dependency still installs
    from the registry.
    """
    require_bwrap()
    problem = outbound_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"pasta is required in CI: {problem}")
        pytest.skip(problem)
    loopback = socket.create_server(("127.0.0.1", 0))
    everywhere = socket.create_server(("0.0.0.0", 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("198.51.100.1", 9))  # the host's address on its default route
        address = udp.getsockname()[0]
    port, other = loopback.getsockname()[1], everywhere.getsockname()[1]
    targets = [("127.0.0.1", port), ("0.0.0.0", other), (address, other)]
    repo = make_repo(
        tmp_path / "hooked",
        {
            "pyproject.toml": HOOKED_PYPROJECT,
            "hatch_build.py": HOOK.replace("TARGETS_HERE", repr(targets)),
            "src/hooked/__init__.py": "import iniconfig\n",
        },
    )
    base = git(repo, "rev-parse", "HEAD")  # the hook was merged: it is the job's base now
    settings = Settings(
        home=tmp_path / "home", uv_cache_dir=Path(os.environ["MERLIN_UV_CACHE_DIR"])
    )
    config = MerlinConfig(tiers=[Tier(name="t", model="scripted/none.yaml")])
    built = ensure_environment(settings, config, repo, base, "hooked", trusted=base)
    assert built is not None
    assert built.network.startswith("outbound only")
    found = (built.path / "hook.txt").read_text()
    assert "reached" not in found, found
    assert found.count("refused") >= len(targets)
    for listener in (loopback, everywhere):
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing came
        listener.close()
    box = confine(repo, built, config)  # a step: the registry's package is installed
    result = run_confined(["python", "-c", "import hooked, iniconfig"], box, config.sandbox, 60)
    assert result.ok, result.output_tail
