"""The default environment of each kind of project, and what its commands run with.

When ``[environment] setup`` is unset, each kind whose marker file is at the
repository's root adds its setup (a repository with several kinds gets each one's):

- **Python**: a uv virtual environment in ``$MERLIN_ENV``, the project installed
  editable with its test extras (or its requirements when it is not installable), and
  pytest.
- **Rust**: ``cargo fetch`` (``--locked`` when ``Cargo.lock`` is committed) into a
  ``CARGO_HOME`` at ``$MERLIN_ENV/cargo``. The worker user's own cargo configuration
  (``config.toml`` of its ``CARGO_HOME``: source replacements, registries, never
  ``credentials.toml``) is copied there first. Commands then run offline
  (``CARGO_NET_OFFLINE=true``) with the build output in the environment's build cache,
  so builds are incremental across attempts.
- **Node**: the lock file's package manager installs (``npm ci``, ``pnpm install
  --frozen-lockfile``, ``yarn install --immutable``; ``npm install`` without a lock
  file), and the installed ``node_modules`` moves to ``$MERLIN_ENV/node_modules``,
  which commands see, read-only, at ``/workspace/node_modules``.
- **Go**: ``go mod download`` into a ``GOMODCACHE`` at ``$MERLIN_ENV/gomod`` (nothing
  to download for a vendored module). Commands then run with ``GOPROXY=off`` and the
  build cache (``GOCACHE``) in the environment's build cache.

The environment is read-only to commands; its build cache (``$MERLIN_ENV/build``,
seen at ``/merlin/build``) is the one folder of it they may write: a compiler's
incremental output, shared by the attempts of a repository while its cache key holds
(cargo locks its target folder; Go's cache is safe for concurrent use). The build cache
and ``node_modules`` are bound only when they are no symlink and lie inside the
environment (``environment_files.inside``).

Setup shares uv's and npm's package caches across builds; the build of a step's own
dependency change gets private copies of them instead, removed after it
(``package_caches``), so nothing the model's build code writes there reaches a later
build.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

from merlin_flow.config import MerlinConfig
from merlin_flow.errors import SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Sandbox, SandboxMode
from merlin_flow.workspace.environment_files import BUILD_DIR, NODE_MODULES, inside
from merlin_flow.workspace.exit_commands import MARKERS, ProjectKind
from merlin_flow.workspace.git import run_git
from merlin_flow.workspace.sandbox import WORKSPACE, Confinement, interpreter, python_mounts
from merlin_flow.workspace.toolchains import find_toolchain, toolchain_mounts

TEST_EXTRAS = ("test", "tests", "testing")
REQUIREMENT_FILES = (
    "requirements.txt",
    "requirements-test.txt",
    "requirements-dev.txt",
    "test-requirements.txt",
    "dev-requirements.txt",
)
BUILD_INSIDE = "/merlin/build"
"""Where sandboxed commands see the build cache."""
CACHE_INSIDE = "/merlin/cache"
"""Where setup sees the package caches (``uv``, ``npm``), shared by every build."""
NODE_LOCKS = (
    ("pnpm-lock.yaml", "pnpm install --frozen-lockfile"),
    (
        "yarn.lock",
        "if yarn --version | grep -q '^1[.]'; then yarn install --frozen-lockfile; "
        "else yarn install --immutable; fi",
    ),
    ("package-lock.json", "npm ci"),
    ("npm-shrinkwrap.json", "npm ci"),
)
"""Lock files, most specific first, and the install each one asks for."""


def project_kinds(names: Iterable[str]) -> tuple[ProjectKind, ...]:
    """Every kind whose marker is among ``names`` (the root's), in ``MARKERS`` order."""
    present = set(names)
    return tuple(kind for kind, markers in MARKERS if present & set(markers))


def default_setup(
    kinds: Iterable[ProjectKind], git_dir: Path, commit: str, names: set[str]
) -> list[str]:
    """The setup commands of ``kinds``, in order, for the repository at ``commit``."""
    commands: list[str] = []
    for kind in kinds:
        if kind is ProjectKind.PYTHON:
            commands += default_python_setup(git_dir, commit, names)
        elif kind is ProjectKind.RUST:
            commands.append("cargo fetch --locked" if "Cargo.lock" in names else "cargo fetch")
        elif kind is ProjectKind.NODE:
            install = next((c for lock, c in NODE_LOCKS if lock in names), "npm install")
            commands.append(f'{install} && mv node_modules "$MERLIN_ENV/node_modules"')
        elif kind is ProjectKind.GO and not _vendored(git_dir, commit):
            commands.append("go mod download")
    return commands


def default_python_setup(git_dir: Path, commit: str, names: set[str]) -> list[str]:
    """uv: a virtual environment, the project editable with its test extras, and pytest."""
    python = shlex.quote(str(interpreter()))
    commands = [f'uv venv --quiet --allow-existing --python {python} "$MERLIN_ENV"']
    pyproject = read_toml(git_dir, commit, "pyproject.toml") if "pyproject.toml" in names else {}
    project = pyproject.get("project") if isinstance(pyproject.get("project"), dict) else None
    extras = sorted(set(TEST_EXTRAS) & set((project or {}).get("optional-dependencies") or {}))
    groups = sorted(set((*TEST_EXTRAS, "dev")) & set(pyproject.get("dependency-groups") or {}))
    installable = "build-system" in pyproject or "setup.py" in names or "setup.cfg" in names
    install = ["uv", "pip", "install", "--quiet"]
    if installable:
        install += ["-e", shlex.quote(f".[{','.join(extras)}]" if extras else ".")]
    elif project is not None:
        install += ["-r", "pyproject.toml", *(f"--extra={extra}" for extra in extras)]
    install += [f"-r {name}" for name in REQUIREMENT_FILES if name in names]
    install += [f"--group={group}" for group in groups]
    install.append("pytest")
    commands.append(" ".join(install))
    return commands


def kind_variables(
    kinds: Iterable[ProjectKind],
    env_dir: str,
    build_dir: str,
    *,
    setup: bool,
    offline: bool | None = None,
) -> dict[str, str]:
    """The variables ``kinds`` need, the environment and build cache being at these paths.

    The paths are as the command sees them; ``setup``: for the build; ``offline``
    (default: all but the build): the package managers may not reach the network.
    """
    offline = not setup if offline is None else offline
    variables: dict[str, str] = {}
    for kind in kinds:
        if kind is ProjectKind.RUST:
            variables["CARGO_HOME"] = f"{env_dir}/cargo"
            variables["CARGO_TARGET_DIR"] = f"{build_dir}/target"
            if offline:
                variables["CARGO_NET_OFFLINE"] = "true"
        elif kind is ProjectKind.NODE:
            variables["npm_config_update_notifier"] = "false"
            variables["npm_config_fund"] = "false"
            # The worker's pnpm, not the one `packageManager` pins: that one would be
            # downloaded, and commands have no network.
            variables["npm_config_manage_package_manager_versions"] = "false"
            if offline:
                variables["npm_config_offline"] = "true"
        elif kind is ProjectKind.GO:
            variables["GOMODCACHE"] = f"{env_dir}/gomod"
            variables["GOCACHE"] = f"{build_dir}/go"
            variables["GOTOOLCHAIN"] = "local"  # never download another Go
            variables["GOFLAGS"] = "-modcacherw"  # so `merlin prune` can remove it
            if offline:
                variables["GOPROXY"] = "off"
    return variables


def confine_kinds(
    confinement: Confinement,
    kinds: Iterable[ProjectKind],
    sandbox: Sandbox,
    *,
    setup: bool,
    offline: bool | None = None,
) -> Confinement:
    """``confinement`` with what ``kinds`` need to run.

    That is their toolchains (bound read-only where the worker's user installed them),
    their variables, the environment's build cache (writable) and its ``node_modules``
    (read-only, at ``/workspace/node_modules``).
    """
    kinds = tuple(kinds)
    found = [t for t in (find_toolchain(kind) for kind in kinds) if t is not None]
    path, read_only, variables = toolchain_mounts(found)
    writable, binds = list(confinement.writable), list(confinement.worktree_binds)
    env = confinement.env_dir
    if env is not None:
        build = env / BUILD_DIR
        with suppress(FileExistsError):  # there, or a link: mkdir follows none
            build.mkdir()
        bwrap = sandbox.mode is SandboxMode.BWRAP
        env_inside = confinement.inside(sandbox)[1] or str(env)
        build_inside = BUILD_INSIDE if bwrap else str(build)
        if bwrap and not confinement.env_writable:
            if inside(env, BUILD_DIR) is not None:  # never a folder a link names
                writable.append((build, BUILD_INSIDE))
        elif bwrap:  # setup: the environment is writable, its build cache with it
            build_inside = f"{env_inside}/{BUILD_DIR}"
        modules = inside(env, NODE_MODULES)
        if bwrap and not setup and modules is not None and modules.is_dir():
            binds.append((modules, f"{WORKSPACE}/{NODE_MODULES}"))
        variables.update(
            kind_variables(kinds, env_inside, build_inside, setup=setup, offline=offline)
        )
    return replace(
        confinement,
        path=(*confinement.path, *path),
        read_only=(
            *confinement.read_only,
            *(p for p in read_only if p not in confinement.read_only),
        ),
        writable=tuple(writable),
        worktree_binds=tuple(binds),
        variables={**variables, **confinement.variables},
    )


def setup_confinement(
    settings: Settings,
    config: MerlinConfig,
    kinds: tuple[ProjectKind, ...],
    checkout: Path,
    folder: Path,
    network: bool,
    caches: Mapping[str, Path] | None = None,
) -> Confinement:
    """Setup's sandbox: the environment writable, uv and the package caches.

    ``network``: False for a build of dependency files a step changed. ``caches``: the
    package caches by name (``package_caches``); default, the shared ones.
    """
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    tools = (str(Path(uv).parent),) if uv else ()
    bwrap = config.sandbox.mode is SandboxMode.BWRAP
    caches = shared_caches(settings) if caches is None else caches
    seen = {name: f"{CACHE_INSIDE}/{name}" if bwrap else str(c) for name, c in caches.items()}
    confinement = Confinement(
        worktree=checkout,
        env_dir=folder,
        env_writable=True,
        network=network,
        read_only=setup_mounts(tools),
        writable=tuple((c, seen[name]) for name, c in caches.items()) if bwrap else (),
        path=tools,
        variables={
            "UV_CACHE_DIR": seen["uv"],
            "UV_NO_PROGRESS": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "npm_config_cache": seen["npm"],
            **({} if network else {"UV_OFFLINE": "1"}),
        },
    )
    return confine_kinds(confinement, kinds, config.sandbox, setup=True, offline=not network)


def shared_caches(settings: Settings) -> dict[str, Path]:
    """The package caches the builds of trusted commits share, by name (made if missing)."""
    caches = {"uv": settings.uv_cache, "npm": settings.npm_cache}
    for cache in caches.values():
        cache.mkdir(parents=True, exist_ok=True)
    return caches


@contextmanager
def package_caches(settings: Settings, private: bool, scratch: Path) -> Iterator[dict[str, Path]]:
    """The package caches a build binds, by name: the shared ones, or ``private`` copies.

    A build of the model's own build code (a step's dependency change) gets copies of
    them in ``scratch`` (``cp --reflink=auto``: shared blocks where the file system can),
    removed when the build ends: the package managers find what the shared caches hold,
    and nothing the build writes there reaches another build.
    """
    shared = shared_caches(settings)
    if not private:
        yield shared
        return
    try:
        copies = {name: scratch / name for name in shared}
        for name, cache in shared.items():
            copies[name].mkdir(parents=True)
            copy = ["cp", "-a", "--reflink=auto", "--", f"{cache}/.", str(copies[name])]
            proc = subprocess.run(copy, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SetupFailed(
                    f"the {name} package cache could not be copied for the build of a step's "
                    f"dependency change: {proc.stderr.strip()}"
                )
        yield copies
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def setup_mounts(tools: tuple[str, ...]) -> tuple[Path, ...]:
    """What setup needs bound besides the system: uv's folder and the Python it runs on."""
    mounts = list(python_mounts(None))
    for folder in (Path(tool).resolve() for tool in tools):
        inside = folder.is_relative_to("/usr") or any(folder.is_relative_to(m) for m in mounts)
        if not inside:
            mounts.append(folder)
    return tuple(mounts)


def cargo_config(environ: Mapping[str, str] | None = None) -> Path | None:
    """The worker user's cargo configuration file (``$CARGO_HOME/config.toml``), if any."""
    environ = os.environ if environ is None else environ
    home = Path(environ.get("CARGO_HOME") or Path.home() / ".cargo")
    for name in ("config.toml", "config"):
        if (home / name).is_file():
            return home / name
    return None


def prepare_folders(folder: Path, kinds: Iterable[ProjectKind]) -> None:
    """Make the environment's folders before setup: the build cache, the kinds' own."""
    (folder / BUILD_DIR).mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        if kind is ProjectKind.RUST:
            (folder / "cargo").mkdir(exist_ok=True)
            config = cargo_config()
            if config is not None:
                (folder / "cargo" / "config.toml").write_bytes(config.read_bytes())
        elif kind is ProjectKind.GO:
            (folder / "gomod").mkdir(exist_ok=True)


def key_material(kinds: Iterable[ProjectKind]) -> dict[str, str]:
    """What the kinds' environments depend on besides the repository: the cargo config."""
    config = cargo_config() if ProjectKind.RUST in kinds else None
    if config is None:
        return {}
    return {"cargo_config": hashlib.sha256(config.read_bytes()).hexdigest()}


def read_toml(git_dir: Path, commit: str, path: str) -> dict[str, Any]:
    """The TOML file ``path`` at ``commit``; empty when it is missing or malformed."""
    proc = run_git(["show", f"{commit}:{path}"], git_dir)
    try:
        return tomllib.loads(proc.stdout) if proc.returncode == 0 else {}
    except tomllib.TOMLDecodeError:
        return {}  # the install reports it; the plan still names the setup


def _vendored(git_dir: Path, commit: str) -> bool:
    """True when the Go module vendors its dependencies (``vendor/modules.txt``)."""
    proc = run_git(["cat-file", "-e", f"{commit}:vendor/modules.txt"], git_dir)
    return proc.returncode == 0
