"""merlin as a user gets it: the wheel and sdist built from this checkout, and the wheel
installed into a fresh virtual environment.

The install is ``uv pip install`` of the wheel with its declared dependencies, pinned by
``constraints.txt`` as CI and the image pin them: a dependency the wheel forgets to
declare is missing there, however complete the development environment is. uv keeps the
install quick (about 4 s with an empty cache, 1 s with a warm one, where pip takes over
30 s); its cache is the run's shared one (``MERLIN_UV_CACHE_DIR``, tests/conftest.py).
uv does not read pip's configuration, so the host's pip index settings (``pip config
list``: mirrors, find-links, CA bundle, constraints) are handed to it, with pip's own
rule for several indexes: the best match of any.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("alembic", "config", "examples")
"""The folders ``merlin_flow.resources.resource_dir`` finds beside the package."""
_PIP_SETTING = re.compile(r"^(?P<section>[\w:-]*)\.(?P<key>[\w-]+)='(?P<value>.*)'$")
_PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}
"""pip's order: the global section, then the command's own, then PIP_* variables."""


def uv() -> str:
    """The uv beside this Python (a dependency of merlin), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is a dependency of merlin_flow: pip install -e '.[dev]'"
    return found


def build(outdir: Path) -> tuple[Path, Path]:
    """``python -m build``: the sdist, then the wheel built from it; (sdist, wheel)."""
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return sdist, wheel


def shipped_files() -> dict[str, bytes]:
    """Every file of the shipped folders in this checkout, by path, without bytecode."""
    files = {}
    for name in SHIPPED:
        for path in sorted((ROOT / name).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    return files


def pip_index_options() -> tuple[list[str], dict[str, str]]:
    """The host's pip index settings as uv options, and the environment uv needs."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    settings: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        match = _PIP_SETTING.match(line.strip())
        if match is None or match["section"] not in _PRECEDENCE:
            continue
        rank = _PRECEDENCE[match["section"]]
        if rank >= settings.get(match["key"], (-1, ""))[0]:
            settings[match["key"]] = (rank, match["value"])
    value = {key: setting for key, (_rank, setting) in settings.items()}
    options: list[str] = []
    if "index-url" in value:
        options += ["--index-url", value["index-url"]]
    extra = value.get("extra-index-url", "").split()
    for url in extra:
        options += ["--extra-index-url", url]
    if extra:
        options += ["--index-strategy", "unsafe-best-match"]
    for link in value.get("find-links", "").split():
        options += ["--find-links", link]
    for constraint in value.get("constraint", "").split():
        options += ["--constraints", constraint]
    env = {"SSL_CERT_FILE": value["cert"]} if "cert" in value else {}
    return options, env


def install(wheel: Path, venv: Path, python: str | None = None) -> Path:
    """A new virtual environment at ``venv`` (on ``python``, default this one's) with
    ``wheel`` and its dependencies installed; its Python."""
    options, extra_env = pip_index_options()
    env = {**os.environ, **extra_env}
    cache = os.environ.get("MERLIN_UV_CACHE_DIR")
    if cache:
        env["UV_CACHE_DIR"] = cache
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(
        [uv(), "venv", "--quiet", "--python", python or sys.executable, str(venv)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    new_python = venv / "bin" / "python"
    result = subprocess.run(
        [uv(), "pip", "install", "--python", str(new_python),
         "--constraints", str(ROOT / "constraints.txt"), *options, str(wheel)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return new_python
