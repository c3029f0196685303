"""The distributions a user installs: ``python -m build`` makes the sdist and the wheel,
each holds what merlin needs at run time, and the wheel, installed into a fresh virtual
environment, runs ``merlin demo`` from a folder outside the repository.

The install is honest about dependencies: ``uv pip install`` resolves the wheel's own
``Requires-Dist`` (pinned by constraints.txt) into an empty environment, so nothing of
the development environment helps; the imported ``merlin_flow`` is checked to be the
installed copy. uv, with the run's shared package cache, keeps it to seconds
(tests/installed.py has the numbers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import git
from tests.e2e.doc_examples import quickstart_demo_mismatches
from tests.installed import ROOT, SHIPPED, build, install, shipped_files

pytestmark = pytest.mark.e2e
PACKAGES = ("merlin_flow", "workers")
BUNDLED = "merlin_flow/_bundled"
"""Where the wheel carries the shipped folders (``merlin_flow.resources``)."""


def _package_files() -> dict[str, bytes]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    return files


def _sdist_files(sdist: Path) -> dict[str, bytes]:
    with tarfile.open(sdist) as archive:
        files = {}
        for member in archive.getmembers():
            if member.isfile():
                handle = archive.extractfile(member)
                assert handle is not None
                files[member.name.split("/", 1)[1]] = handle.read()
        return files


def _wheel_files(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _check_sdist(sdist: Path) -> None:
    files = _sdist_files(sdist)
    # What building the wheel from it needs (and `python -m build` did build it from it) ...
    for name in ("pyproject.toml", "README.md"):  # the readme is the wheel's description
        assert files.get(name) == (ROOT / name).read_bytes(), name
    # ... and every source and shipped file, as in the checkout.
    for name, content in {**_package_files(), **shipped_files()}.items():
        assert files.get(name) == content, f"{name} missing or different in the sdist"
    assert not [name for name in files if "__pycache__" in name or name.startswith(".venv/")]


def _check_wheel(wheel: Path) -> None:
    files = _wheel_files(wheel)
    expected = {
        **_package_files(),
        **{f"{BUNDLED}/{name}": content for name, content in shipped_files().items()},
    }
    for name in SHIPPED:  # what resource_dir() looks for
        assert any(path.startswith(f"{BUNDLED}/{name}/") for path in expected), name
    assert f"{BUNDLED}/config/merlin.toml" in expected
    assert f"{BUNDLED}/examples/demo/tasklist.yaml" in expected
    assert any(re.match(rf"{BUNDLED}/alembic/versions/\d+_\w+\.py$", p) for p in expected)
    info = {name: content for name, content in files.items() if ".dist-info/" in name}
    # Exactly the packages and the shipped folders: no tests, no stray files.
    assert {name: files[name] for name in files if name not in info} == expected

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (metadata_name,) = (name for name in info if name.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(info[metadata_name].decode())
    assert metadata["Name"] == project["name"]
    assert metadata["Version"] == project["version"]
    assert metadata["Requires-Python"] == project["requires-python"]
    required = {
        _normalized(line)
        for line in metadata.get_all("Requires-Dist") or []
        if "extra ==" not in line
    }
    assert required == {_normalized(line) for line in project["dependencies"]}
    (entry_points,) = (c for n, c in info.items() if n.endswith(".dist-info/entry_points.txt"))
    assert "merlin = merlin_flow.cli:main" in entry_points.decode()


def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo(tmp_path: Path) -> None:
    sdist, wheel = build(tmp_path / "dist")
    _check_sdist(sdist)
    _check_wheel(wheel)

    venv = tmp_path / "venv"
    python = install(wheel, venv)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tmp").mkdir(parents=True)
    home = tmp_path / "home"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "MERLIN_HOME": str(home),
        "TMPDIR": str(elsewhere / "tmp"),  # where the demo makes its throwaway repository
    }
    # The merlin that runs is the installed copy, with its files bundled: not this checkout.
    where = subprocess.run(
        [str(python), "-c", "import json, merlin_flow, workers\n"
         "from merlin_flow.resources import resource_dir\n"
         "print(json.dumps([merlin_flow.__file__, workers.__file__]"
         " + [str(resource_dir(n)) for n in ('alembic', 'config', 'examples')]))"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    site = venv / "lib"
    for path in json.loads(where.stdout):
        assert Path(path).is_relative_to(site), path
        assert not Path(path).is_relative_to(ROOT), path

    result = subprocess.run(
        ["merlin", "demo"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    assert "Models are scripted" in out
    shown = re.search(r"throwaway repository: (\S+)", out)
    assert shown, out[-4000:]
    repo = Path(shown[1])
    assert repo.is_relative_to(elsewhere / "tmp")
    job = re.search(r"job ([0-9a-f]{12}) completed: branch (merlin/\1)", out)
    assert job, out[-4000:]
    assert "next: escalate on tier premium" in out
    assert "step fix passed on tier premium" in out
    assert "+    return sum(values) / len(values)" in out  # the diff it prints last
    # docs/quickstart.md shows this run's progress and summary: the wheel keeps them true.
    assert quickstart_demo_mismatches(out) == []
    # Its state went to the fresh MERLIN_HOME, its work to the throwaway repository.
    assert (home / "merlin.db").is_file()
    assert (home / "jobs" / job[1] / f"{job[1]}.patch").is_file()
    assert "return sum(values) / len(values)" in git(repo, "show", f"{job[2]}:calc.py")


def _normalized(line: str) -> str:
    """A requirement with its name normalized (``PyGithub``: ``pygithub``), as a build may."""
    requirement = Requirement(line)
    requirement.name = canonicalize_name(requirement.name)
    return str(requirement)
