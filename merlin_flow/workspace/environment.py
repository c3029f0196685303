"""The project's own environment: built once per cache key, reused by every attempt.

A step's commands must run with the project's dependencies, on the attempt's code. The
environment is built by ``[environment] setup`` (or the default for the project's kind)
inside the sandbox, with the project checked out at ``/workspace``, the environment at
``/merlin/env`` and the outbound network only (``merlin_flow.workspace.network``).
Attempts later see their own worktree at the same ``/workspace``, so an editable install
made by setup resolves to the attempt's code, never to the user's checkout or to another
attempt.

Built environments live in ``$MERLIN_HOME/envs/<repo>-<key>``. The key hashes the setup
commands, the sandbox mode, the interpreter and the content of the ``cache_key`` files
at the commit, so every job and attempt of a repository shares one environment while
those files are unchanged. One build at a time per key (an flock); a build that fails
leaves nothing behind and fails the job with its output.

What runs at build time is trusted only from the job's base commit (``trusted``): a
commit with the base's key gets the environment built from the base's own tree (the
build code outside the key files, ``hatch_build.py`` or a ``setup.py`` helper, may have
changed), and one whose key differs (a step changed the dependency files) gets one of
its own, built from its tree with package caches of its own and (unless ``[environment]
attempt_network``) no network, and keyed by it and its base too: no other commit's
checkout, and no later job, finds it.

What the worker itself then reads and writes of a built environment (its marker, the
files setup generated, the folders the sandbox binds) goes through
``merlin_flow.workspace.environment_files``, never through a link setup left.

The default setup of each kind (Python, Rust, Node, Go) is in
``merlin_flow.workspace.default_setup``; the toolchains setup and commands run with
are found by ``merlin_flow.workspace.toolchains``.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from merlin_flow.config import MerlinConfig
from merlin_flow.errors import SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.tool_config import SandboxMode
from merlin_flow.workspace.commit_trees import object_ids, root_entries
from merlin_flow.workspace.default_setup import (
    default_setup,
    key_material,
    package_caches,
    prepare_folders,
    project_kinds,
    setup_confinement,
)
from merlin_flow.workspace.environment_files import MARKER_FILE as MARKER_FILE
from merlin_flow.workspace.environment_files import (
    check_built,
    copy_generated_files,
    keep_generated_files,
    touch_marker,
    write_marker,
)
from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.git import add_worktree, git, remove_worktree, run_git
from merlin_flow.workspace.network import describe, outbound
from merlin_flow.workspace.sandbox import Confinement, interpreter, run_confined

FORMAT = 2
"""Bumped when the layout of a built environment changes, so old ones are not reused.

2: the overlay is the worker's, written after setup; an environment whose build cache,
``node_modules`` or ``pyvenv.cfg`` is a link is refused.
"""
DEFAULT_CACHE_KEY = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements*.txt",
    "*requirements.txt",
    "uv.lock",
    "poetry.lock",
    "Pipfile.lock",
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "pnpm-lock.yaml",
    "yarn.lock",
    "Cargo.toml",
    "Cargo.lock",
    ".cargo/config.toml",
    "go.mod",
    "go.sum",
)
SETUP_OUTPUT_LINES = 40
OFFLINE_HINT = (
    "\nThis build ran without the network: the step changed the project's dependency "
    "files, and the packages they name must already be in the caches. To let such "
    "builds download, set `attempt_network = true` under [environment] in a file you "
    "pass with --config."
)
OUTBOUND_HINT = (
    "\nThis build had the outbound network only: the internet and package registries, not "
    "the host's 127.0.0.1 nor its local network. A proxy or index there is reached when "
    "HTTPS_PROXY, UV_INDEX_URL or the like names it (on its port alone); for anything else, "
    'set `network = "host"` under [sandbox] in a file you pass with --config.'
)


@dataclass(frozen=True)
class EnvironmentPlan:
    """How a repository's environment is built at one commit, and under which key."""

    kind: ProjectKind | None
    """The project's kind, from its marker files (the first of ``kinds``)."""
    kinds: tuple[ProjectKind, ...]
    """Every kind whose marker file is at the root (a mixed repository has several)."""
    setup: list[str]
    """Shell commands run in order; empty when the project gets no environment."""
    default: bool
    """True when ``setup`` is the default for the kind, not the configuration's."""
    key: str
    """Hash of everything the environment depends on."""

    @property
    def needed(self) -> bool:
        """True when there is an environment to build."""
        return bool(self.setup)


@dataclass(frozen=True)
class BuiltEnvironment:
    """A ready environment: its folder, and whether this call built it."""

    path: Path
    built: bool
    seconds: float = 0.0
    network: str = ""
    """What the build's network was, in words (``network.describe``); empty when reused."""


def plan_environment(
    git_dir: Path, commit: str, config: MerlinConfig, location: str | None = None
) -> EnvironmentPlan:
    """The environment of the repository at ``git_dir`` as of ``commit``.

    ``location`` (the job's repository path or URL; default ``git_dir``) is part of the
    key: two repositories never share an environment, whatever their names.
    """
    names = _root_names(git_dir, commit)
    kinds = project_kinds(names)
    configured = config.environment.setup
    if configured is not None:
        setup, default = list(configured), False
    else:
        setup, default = default_setup(kinds, git_dir, commit, names), True
    patterns = config.environment.cache_key or list(DEFAULT_CACHE_KEY)
    files = _key_files(git_dir, commit, patterns, names)
    material = {
        "format": FORMAT,
        "repository": location or str(git_dir.resolve()),
        "setup": setup,
        "version": release_version(git_dir, commit),
        "mode": config.sandbox.mode.value,
        "python": str(interpreter()),
        "files": files,
        **key_material(kinds),
    }
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    kind = kinds[0] if kinds else None
    return EnvironmentPlan(kind=kind, kinds=kinds, setup=setup, default=default, key=key)


def release_version(git_dir: Path, commit: str) -> str:
    """The newest release tag reachable from ``commit`` (``v1.2`` gives ``1.2``), or 0.0.0.

    Setup cannot see the repository's git directory, so build backends that take the
    version from git (setuptools-scm, hatch-vcs) are told this one instead.
    """
    proc = run_git(["describe", "--tags", "--abbrev=0", commit], git_dir)
    tag = proc.stdout.strip().removeprefix("v") if proc.returncode == 0 else ""
    return tag if re.fullmatch(r"\d+(\.\d+)*([._-]?\w+)*", tag) else "0.0.0"


def describe_environment(repo: Path, config: MerlinConfig) -> EnvironmentPlan:
    """The environment a job on the work tree ``repo`` would get (at its HEAD)."""
    return plan_environment(repo, git("rev-parse", "HEAD^{commit}", cwd=repo), config)


def ensure_environment(
    settings: Settings,
    config: MerlinConfig,
    git_dir: Path,
    commit: str,
    repo_name: str,
    location: str | None = None,
    trusted: str | None = None,
) -> BuiltEnvironment | None:
    """The environment for ``commit``, built now if no worker has built it yet.

    ``trusted``: the commit whose build code the user wrote (the job's base; None: the
    caller trusts ``commit``). When ``commit`` has its key, the environment is the one
    built from ``trusted``'s tree. Otherwise (a step changed the dependency files) it is
    ``commit``'s alone, keyed by both commits, and built from ``commit``'s tree with
    private copies of the package caches and, unless ``[environment] attempt_network``,
    no network: the model's own build code (a build hook) must not reach the network,
    the services beside the worker, or a later build. None when the project gets no
    environment. Raises SetupFailed with the failing command's output when setup
    fails; nothing of the failed build is kept.
    """
    plan = plan_environment(git_dir, commit, config, location)
    if not plan.needed:
        return None
    source, own = commit, False
    if trusted is not None and trusted != commit:
        base = plan_environment(git_dir, trusted, config, location)
        if base.key == plan.key:  # the base's own build code, whatever else the step changed
            source, plan = trusted, base
        else:
            own = True
            mine = json.dumps([plan.key, commit, trusted]).encode()
            plan = replace(plan, key=hashlib.sha256(mine).hexdigest()[:16])
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", repo_name)[:40] or "repo"
    folder = settings.envs_dir / f"{slug}-{plan.key}"
    with _locked(folder):  # looked at under the lock: never while setup can still write it
        if (folder / MARKER_FILE).is_file():  # built before, or while we waited
            touch_marker(folder)  # its last use: `merlin prune` goes by it
            return BuiltEnvironment(folder, built=False)
        started = time.monotonic()
        reached = _build(settings, config, plan, git_dir, source, folder, own)
        seconds = time.monotonic() - started
        return BuiltEnvironment(folder, built=True, seconds=seconds, network=reached)


def _build(
    settings: Settings,
    config: MerlinConfig,
    plan: EnvironmentPlan,
    git_dir: Path,
    commit: str,
    folder: Path,
    own: bool = False,
) -> str:
    """Run the setup commands into ``folder``; SetupFailed (and nothing kept) on failure.

    ``own``: the build of a step's own dependency change, with private copies of the
    package caches (``default_setup.package_caches``) and, unless ``[environment]
    attempt_network``, no network: the package managers work from those copies only.
    Otherwise setup has the outbound network (``merlin_flow.workspace.network``), or the
    host's with ``[sandbox] network = "host"`` or where pasta cannot run (the log's first
    line says which, and the worker's log warns). The environment is then checked
    (``environment_files.check_built``). Returns what the network was, in words.
    """
    shutil.rmtree(folder, ignore_errors=True)  # a build a killed worker left unfinished
    folder.mkdir(parents=True)
    checkout = setup_checkouts(settings) / f"{folder.name}-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + config.environment.setup_timeout
    try:
        add_worktree(git_dir, checkout, commit)
        prepare_folders(folder, plan.kinds)
        network = not own or config.environment.attempt_network
        scratch = checkout.with_name(checkout.name + ".cache")  # swept as the checkout is
        with package_caches(settings, own, scratch) as caches:
            confinement = setup_confinement(
                settings, config, plan.kinds, checkout, folder, network, caches
            )
            host = config.sandbox.network == "host"
            wanted: bool | Literal["host"] = ("host" if host else True) if network else False
            confinement = replace(
                confinement,
                network=wanted,
                variables={
                    **confinement.variables,
                    "SETUPTOOLS_SCM_PRETEND_VERSION": release_version(git_dir, commit),
                },
            )
            reached = _run_setup(config, plan, confinement, folder, deadline)
        check_built(folder)
        kept = keep_generated_files(checkout, folder)
        write_marker(
            folder, {"key": plan.key, "setup": plan.setup, "commit": commit, "generated": kept}
        )
        return reached
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        remove_worktree(git_dir, checkout)


def _run_setup(
    config: MerlinConfig, plan: EnvironmentPlan, box: Confinement, folder: Path, deadline: float
) -> str:
    """Run ``plan``'s commands in order, logged; what the network was, in words."""
    log_path = folder.with_name(folder.name + ".log")
    reached, hint = _network_words(config, box.network)
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"[merlin] network: {reached}\n")
        for command in plan.setup:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SetupFailed(f"environment setup timed out before `{command}`")
            argv = ["/bin/sh", "-c", command]
            result = run_confined(argv, box, config.sandbox, remaining, 20_000)
            log.write(f"$ {command}\n{result.output_tail}\nexit code {result.exit_code}\n")
            if not result.ok:
                tail = "\n".join(result.output_tail.rstrip().splitlines()[-SETUP_OUTPUT_LINES:])
                raise SetupFailed(
                    f"environment setup failed: `{command}` exited with code "
                    f"{result.exit_code}{' (timed out)' if result.timed_out else ''}; "
                    f"setup log: {log_path}\n{tail}{hint}"
                )
    return reached


def _network_words(config: MerlinConfig, wanted: bool | Literal["host"]) -> tuple[str, str]:
    """What setup's network is, in words, and what a failed build adds to its error."""
    if config.sandbox.mode is SandboxMode.NONE:
        return 'the host\'s network (`[sandbox] mode = "none"`)', ""
    if wanted is False:
        return describe(wanted), OFFLINE_HINT
    return describe(wanted), OUTBOUND_HINT if outbound(wanted) is True else ""


def prepare_worktree(environment: BuiltEnvironment | None, worktree: Path) -> None:
    """Copy the files setup generated (a version file, in-place built modules) into it.

    An editable install can need files that setup wrote into the project's tree and git
    ignores (hatch-vcs's ``_version.py``, an extension built in place): every attempt's
    worktree gets them, never over a file the commit has, and never through a symlink
    that leads out of the worktree (``environment_files.copy_generated_files``).
    """
    if environment is not None:
        copy_generated_files(environment.path, worktree)


def setup_checkouts(settings: Settings) -> Path:
    """Where builds check the project out (``<environment folder>-<random>`` each)."""
    return settings.worktrees_dir / "_setup"


@contextmanager
def _locked(folder: Path, wait: bool = True) -> Iterator[bool]:
    """One build of ``folder`` at a time, across threads, processes and workers (flock).

    Yields whether it holds the lock: always when ``wait``, else only if no build runs.
    The kernel drops the lock of a killed builder.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    with folder.with_name(folder.name + ".lock").open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def idle_build(settings: Settings, checkout: Path) -> Iterator[bool]:
    """Whether no build runs for the setup checkout ``checkout``: held while True."""
    folder = settings.envs_dir / checkout.name.rpartition("-")[0]
    with _locked(folder, wait=False) as free:
        yield free


def _root_names(git_dir: Path, commit: str) -> set[str]:
    return set(root_entries(git_dir, commit))


def _key_files(
    git_dir: Path, commit: str, patterns: list[str], names: set[str]
) -> dict[str, str | None]:
    """Blob ids of the cache-key files (globs match names at the repository root)."""
    paths: set[str] = set()
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            paths.update(n for n in names if fnmatch.fnmatchcase(n, pattern))
        else:
            paths.add(pattern)
    return object_ids(git_dir, commit, sorted(paths))
