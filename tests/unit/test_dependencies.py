"""constraints.txt pins what pyproject.toml allows, for every dependency."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return [Requirement(text) for text in wanted]


def test_every_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    requirements = _requirements()
    assert len(requirements) > 10  # both lists are read
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside {requirement.specifier}"
        )


def test_litellm_is_bounded_above() -> None:
    (litellm,) = [r for r in _requirements() if r.name == "litellm"]
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in litellm.specifier)
