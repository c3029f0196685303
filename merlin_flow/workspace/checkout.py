"""A checkout: the one place where an attempt's agent, or a verdict's exit command, works.

A ``Checkout`` holds all a step's commands need, assembled once: a worktree of the
job's repository at a commit, the project's environment prepared in it
(``merlin_flow.workspace.environment``), and the sandbox its commands run in
(``merlin_flow.workspace.sandbox``), with the `[permissions]` path rules as mounts: what
a `Read` deny or ask covers is hidden, what an `Edit`/`Write` one covers is read-only
(``permission_masks``, read from the worktree as it is when the checkout opens). The
agent's toolbox, its MCP servers and the exit command all receive the checkout; none
of them puts it together from its parts.

``open_checkout`` makes one for a job and removes its worktree afterwards;
``Checkout.folder`` makes one of a plain folder (a question's detached worktree, tests).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from merlin_flow.config import MerlinConfig
from merlin_flow.settings import Settings
from merlin_flow.tool_config import PermissionRules, Rule, Sandbox, parse_rule
from merlin_flow.workspace.default_setup import confine_kinds, project_kinds
from merlin_flow.workspace.environment import (
    BuiltEnvironment,
    ensure_environment,
    prepare_worktree,
)
from merlin_flow.workspace.exit_commands import run_exit_command
from merlin_flow.workspace.git import add_worktree, remove_worktree
from merlin_flow.workspace.process import OUTPUT_TAIL_CHARS, CommandResult
from merlin_flow.workspace.repository import JobRepository
from merlin_flow.workspace.sandbox import (
    Confinement,
    SandboxMasks,
    python_mounts,
    run_confined,
)


@dataclass(frozen=True)
class Checkout:
    """A worktree with its environment and sandbox: where a step's commands run."""

    worktree: Path
    """The host folder the commands see as their working directory."""
    sandbox: Sandbox
    """The `[sandbox]` settings (mode, network, limits)."""
    confinement: Confinement
    """What the commands may see: the worktree, the environment, the permission masks."""
    environment: BuiltEnvironment | None = None
    """The project's environment, or None when the project has none."""
    stop: Callable[[], bool] | None = None
    """Asked while a command runs: True (its job was cancelled) kills the command."""

    @classmethod
    def folder(cls, root: Path, sandbox: Sandbox | None = None) -> Checkout:
        """``root`` as a checkout of its own: no environment, merlin's interpreter on PATH."""
        confinement = Confinement(
            worktree=root.resolve(),
            read_only=python_mounts(None),
            path=(str(Path(sys.executable).parent),),
        )
        return cls(root.resolve(), sandbox or Sandbox(), confinement)

    def read_only(self) -> Checkout:
        """The same checkout with the whole worktree bound read-only (an agent that reads)."""
        return replace(self, confinement=replace(self.confinement, worktree_writable=False))

    def run(
        self, argv: list[str], timeout: float, tail_chars: int = OUTPUT_TAIL_CHARS
    ) -> CommandResult:
        """Run ``argv`` in the worktree, in the sandbox; SandboxUnavailable without one."""
        return run_confined(argv, self.confinement, self.sandbox, timeout, tail_chars, self.stop)

    def run_exit_command(self, command: str, config: MerlinConfig) -> CommandResult:
        """Run a step's exit command here, as ``config`` says (shell, timeout)."""
        return run_exit_command(command, self.confinement, config, self.stop)


def confine(
    worktree: Path,
    environment: BuiltEnvironment | None,
    config: MerlinConfig,
    *,
    writable: bool = True,
) -> Confinement:
    """How a step's commands are confined in ``worktree``, the permission masks included.

    The toolchains, variables and caches of the project's kinds (from the marker files at
    the worktree's root, ``default_setup.confine_kinds``) are added.
    ``writable=False``: the worktree is read-only too (an agent without a tool that writes).
    """
    if environment is None:
        # No environment: merlin's own interpreter first on PATH (read-only).
        confinement = Confinement(
            worktree=worktree,
            network=config.sandbox.network,
            read_only=python_mounts(None),
            path=(str(Path(sys.executable).parent),),
            worktree_writable=writable,
        )
    else:
        confinement = Confinement(
            worktree=worktree,
            env_dir=environment.path,
            network=config.sandbox.network,
            read_only=python_mounts(environment.path),
            worktree_writable=writable,
        )
    kinds = project_kinds(entry.name for entry in os.scandir(worktree))
    confinement = confine_kinds(confinement, kinds, config.sandbox, setup=False)
    rules = config.permissions
    if rules.deny or rules.ask or rules.default == "deny":
        confinement = confinement.masked(permission_masks(rules, worktree))
    return confinement


def permission_masks(rules: PermissionRules, worktree: Path) -> SandboxMasks:
    """The existing paths of ``worktree`` that commands must not read, or change.

    Hidden: what ``Read`` deny/ask rules cover; read-only: what ``Edit``/``Write``
    deny/ask rules cover. Each is as few paths as can be: a folder covered whole
    stands for what it holds (the root itself when a rule covers everything). The
    walk skips ``.git`` and follows no symlink; a covered link stands for its target
    when that is inside the worktree.
    """
    refusing = [parse_rule(text) for text in (*rules.deny, *rules.ask)]
    reading = [r for r in refusing if r.kind == "Read"]
    writing = [r for r in refusing if r.kind in ("Edit", "Write")]
    root = worktree.resolve()
    return SandboxMasks(hidden=_covered(root, reading), read_only=_covered(root, writing))


def _covered(root: Path, rules: list[Rule]) -> tuple[Path, ...]:
    """The fewest existing paths under ``root`` that hold every path ``rules`` cover."""
    if not rules:
        return ()
    if any(r.covers_folder("") for r in rules):
        return (root,)
    found: set[Path] = set()
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root).as_posix()
            if rel == ".git":
                continue
            whole = any(r.covers_folder(rel) for r in rules)
            if entry.is_symlink():
                target = path.resolve()
                if whole and target != root and target.is_relative_to(root) and target.exists():
                    found.add(target)
            elif entry.is_dir(follow_symlinks=False):
                if whole:
                    found.add(path)
                else:
                    folders.append(path)
            elif any(r.matches_path(rel) for r in rules):
                found.add(path)
    return tuple(sorted(p for p in found if not any(a in found for a in p.parents)))


def ready_environment(
    settings: Settings,
    config: MerlinConfig,
    repository: JobRepository,
    commit: str,
    trusted: str | None = None,
) -> BuiltEnvironment | None:
    """The project's environment at ``commit``, built now if no worker has built it yet.

    SetupFailed when setup fails. Environments are named for the repository's folder or
    URL (``merlin prune`` finds a repository's environments by that name). ``trusted``:
    the job's base commit (``ensure_environment``: a commit with its key gets the
    environment built from its tree; a build for dependency files a step changed is that
    commit's alone, with no network).
    """
    where = repository.location
    name = where.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    return ensure_environment(settings, config, repository.path, commit, name, where, trusted)


@contextmanager
def open_checkout(
    settings: Settings,
    config: MerlinConfig,
    repository: JobRepository,
    commit: str,
    worktree: Path,
    on_built: Callable[[BuiltEnvironment], None] | None = None,
    stop: Callable[[], bool] | None = None,
    trusted: str | None = None,
) -> Iterator[Checkout]:
    """A checkout of ``commit`` at ``worktree``, its environment ready; removed at the end.

    ``on_built`` is told of an environment this call built (the engine records it);
    ``stop`` is asked while each of its commands runs (``Checkout.stop``); ``trusted``
    is the job's base commit (``ready_environment``).
    SetupFailed when the environment cannot be built; nothing is checked out then.
    """
    environment = ready_environment(settings, config, repository, commit, trusted)
    if environment is not None and environment.built and on_built is not None:
        on_built(environment)
    try:
        add_worktree(repository.path, worktree, commit)
        prepare_worktree(environment, worktree)
        confinement = confine(worktree, environment, config)
        yield Checkout(worktree, config.sandbox, confinement, environment, stop)
    finally:
        remove_worktree(repository.path, worktree)
