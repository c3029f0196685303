"""Where a step's commands run: a bubblewrap sandbox that holds no secret.

Every ``run_command`` tool call, every exit command and every environment setup runs
through ``run_confined``. With ``[sandbox] mode = "bwrap"`` (the default) the command
sees:

- the system (``/usr``, ``/etc`` less its password files) read-only, a private ``/tmp``,
  its own ``/proc`` and PID namespace, and no network unless ``[sandbox] network`` (setup:
  outbound only, through pasta, ``workspace.network``);
- the attempt's worktree read-write at ``/workspace`` (its ``.git`` pointer read-only;
  the whole worktree read-only for a read-only agent), and the project's environment
  read-only at ``/merlin/env`` (writable during setup);
- the paths ``[permissions]`` denies (``SandboxMasks``, from
  ``merlin_flow.workspace.checkout``): a hidden folder is an empty read-only tmpfs, a hidden
  file is ``/dev/null`` on a ``nodev`` mount (opening it fails), a protected path is
  bound read-only onto itself;
- an environment built from an allowlist: never the worker's keys, tokens or URLs.

Every capability is dropped (``--cap-drop ALL``), also for a worker running as root, so
a command can neither unmount a mask nor remount the worktree; in a namespace of its own
the masks are locked to the mounts beneath them and cannot be peeled off or bypassed
with a bind mount either. Masks are mounts on real paths, so a symlink inside the
worktree leads to the mask, not around it.

Nothing of the user's home (but a toolchain's folders, ``workspace.toolchains``),
``MERLIN_HOME``, other worktrees or the repository's git directory is mounted. The
sandbox dies with its parent and is killed whole on timeout.

``mode = "none"`` runs the same commands directly, as the worker's user, with the same
allowlisted environment; it is for machines without bubblewrap and is warned about. It
cannot mask anything: ``unenforceable`` says what a confinement then loses.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from merlin_flow.errors import SandboxUnavailable
from merlin_flow.tool_config import Sandbox, SandboxMode
from merlin_flow.workspace.network import NETWORK_ENV, attach_options, launcher, outbound
from merlin_flow.workspace.process import (
    OUTPUT_TAIL_CHARS,
    CommandResult,
    ResourceLimits,
    run_command,
)

SANDBOX_OFF_WARNING = (
    'warning: [sandbox] mode = "none": this job\'s commands run unconfined, as the '
    "worker's user, with its files, network and environment in reach (docs/security.md)"
)
"""Shown when a job is submitted, and recorded when it starts, with the sandbox off."""
WORKSPACE = "/workspace"
"""Where the attempt's worktree is seen by sandboxed commands."""
ENV_DIR = "/merlin/env"
"""Where the project's environment is seen by sandboxed commands (and built by setup)."""
SANDBOX_HOME = "/tmp/home"
"""HOME inside the sandbox: an empty folder in the private /tmp."""
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
ALLOWED_ENV = (
    "LANG",
    "LC_ALL",
    "TZ",
    # Where the system's CA certificates are: paths, never secrets.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
)
"""The worker's variables a command may see, besides `[sandbox] pass_env`."""
PROBE = ("--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true")
MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssl/private", "/etc/sudoers.d")
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class SandboxMasks:
    """Host paths inside a worktree that commands must not read, or must not change."""

    hidden: tuple[Path, ...] = ()
    """Files and folders hidden from commands (a folder stands for all it holds)."""
    read_only: tuple[Path, ...] = ()
    """Files and folders commands may read but not change."""


@dataclass(frozen=True)
class Confinement:
    """What one command may see besides the system: its worktree, environment, mounts."""

    worktree: Path
    """The host folder seen as the working directory (``/workspace`` in the sandbox)."""
    env_dir: Path | None = None
    """The project's environment (``/merlin/env``), or None when there is none."""
    env_writable: bool = False
    """True during setup only: the environment is being built."""
    network: bool | Literal["host"] = False
    """The command's network: none (False), outbound only (True: ``workspace.network``),
    or the host's (``"host"``; also where pasta cannot run)."""
    read_only: tuple[Path, ...] = ()
    """More host folders bound read-only at their own paths (a Python installation...)."""
    writable: tuple[tuple[Path, str], ...] = ()
    """Host folders bound read-write, each at a path inside (a package cache in setup)."""
    path: tuple[str, ...] = ()
    """Folders put first on PATH, as the command sees them."""
    variables: Mapping[str, str] = field(default_factory=dict)
    """Variables set for the command, after the allowlist."""
    hidden: tuple[Path, ...] = ()
    """Host paths inside the worktree the command must not read (masked where it sees
    them: a folder by an empty read-only tmpfs, a file by /dev/null)."""
    read_only_paths: tuple[Path, ...] = ()
    """Host paths inside the worktree the command must not change (bound read-only)."""
    worktree_writable: bool = True
    """False for a read-only agent: the whole worktree is bound read-only."""
    worktree_binds: tuple[tuple[Path, str], ...] = ()
    """Host folders bound read-only inside the worktree, each at a path under
    ``/workspace`` (the environment's ``node_modules``); bwrap only."""

    def masked(self, masks: SandboxMasks) -> Confinement:
        """A copy with ``masks`` (``checkout.permission_masks``) added to its own."""
        return replace(
            self,
            hidden=(*self.hidden, *masks.hidden),
            read_only_paths=(*self.read_only_paths, *masks.read_only),
        )

    def inside(self, config: Sandbox) -> tuple[str, str | None]:
        """The worktree's and the environment's paths as the command sees them."""
        if config.mode is SandboxMode.BWRAP:
            return WORKSPACE, ENV_DIR if self.env_dir is not None else None
        return str(self.worktree), str(self.env_dir) if self.env_dir is not None else None


def run_confined(
    argv: Sequence[str],
    confinement: Confinement,
    config: Sandbox,
    timeout: float,
    tail_chars: int = OUTPUT_TAIL_CHARS,
    stop: Callable[[], bool] | None = None,
) -> CommandResult:
    """Run ``argv`` in the worktree, confined as ``config`` says; see the module doc.

    ``stop``: asked while the command runs; True kills it (``run_command``).
    """
    limits = resource_limits(config)
    env = command_environment(confinement, config)
    if config.mode is SandboxMode.NONE:
        return run_command(argv, confinement.worktree, timeout, env, tail_chars, limits, stop)
    problem = sandbox_problem()
    if problem:
        raise SandboxUnavailable(problem)
    wrapped = [*bwrap_arguments(confinement, env), "--", *argv]
    # bwrap itself needs no variable: the command's are given with --setenv.
    return run_command(wrapped, confinement.worktree, timeout, {}, tail_chars, limits, stop)


def resource_limits(config: Sandbox) -> ResourceLimits:
    """The limits `[sandbox]` sets on every command: file size and address space."""
    return ResourceLimits(
        file_size=config.max_file_size_mb * 2**20 if config.max_file_size_mb else None,
        memory=config.max_memory_mb * 2**20 if config.max_memory_mb else None,
    )


def command_environment(confinement: Confinement, config: Sandbox) -> dict[str, str]:
    """The variables a command sees: the allowlist, `pass_env` and merlin's own."""
    workspace, env_dir = confinement.inside(config)
    env = {name: os.environ[name] for name in ALLOWED_ENV if name in os.environ}
    env.update(  # a URL with a password is a secret whatever its variable is called
        (name, os.environ[name])
        for name in config.pass_env
        if name in os.environ and not _has_credentials(os.environ[name])
    )
    if confinement.network:
        env.update(
            (name, os.environ[name])
            for name in NETWORK_ENV
            if name in os.environ and not _has_credentials(os.environ[name])
        )
    env.setdefault("LANG", "C.UTF-8")
    path = []
    if env_dir is not None:  # the project's environment first, then merlin's tools
        path += [f"{env_dir}/bin", f"{env_dir}/node_modules/.bin"]
        env["NODE_PATH"] = f"{env_dir}/node_modules"
        env["VIRTUAL_ENV"] = env_dir
        env["MERLIN_ENV"] = env_dir
    env.update(
        {
            "PATH": ":".join([*path, *confinement.path, SYSTEM_PATH]),
            "HOME": SANDBOX_HOME if config.mode is SandboxMode.BWRAP else str(Path.home()),
            "TMPDIR": "/tmp",
            "TERM": "dumb",  # no terminal: output goes to a file
            "MERLIN_WORKSPACE": workspace,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    if config.mode is SandboxMode.NONE:
        # No fixed path without a mount namespace: the worktree's own code is put ahead of
        # an editable install (which points at the setup's checkout).
        roots = [str(confinement.worktree / "src"), str(confinement.worktree)]
        env["PYTHONPATH"] = ":".join(r for r in roots if Path(r).is_dir())
        env.pop("TMPDIR")
    env.update(confinement.variables)
    return env


def _has_credentials(value: str) -> bool:
    """True when ``value`` holds a URL with a user or password (``scheme://user@host``)."""
    return any("@" in part.split("/", 1)[0] for part in value.split("://")[1:])


def bwrap_arguments(confinement: Confinement, env: Mapping[str, str]) -> list[str]:
    """The bubblewrap command line (without the command) for ``confinement``.

    With the outbound network, the launcher that attaches pasta comes first.
    """
    network = outbound(confinement.network)
    prefix = launcher(env) if network is True else []
    args = [*prefix, "bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
    args += ["--cap-drop", "ALL", *(["--share-net"] if network == "host" else [])]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    args += ["--ro-bind", "/etc", "/etc", *(attach_options() if network is True else [])]
    resolv = Path("/etc/resolv.conf")
    if network == "host" and resolv.is_symlink():  # often into /run, which is not mounted
        args += ["--ro-bind-try", str(resolv.resolve()), str(resolv.resolve())]
    args += [arg for f in MASKED_FILES if Path(f).exists() for arg in ("--ro-bind", "/dev/null", f)]
    args += [arg for d in MASKED_DIRS if Path(d).is_dir() for arg in ("--tmpfs", d)]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", SANDBOX_HOME]
    for folder in confinement.read_only:
        args += ["--ro-bind", str(folder), str(folder)]
    for host_path, inside in confinement.writable:
        args += ["--bind", str(host_path), inside]
    worktree_bind = "--bind" if confinement.worktree_writable else "--ro-bind"
    args += [worktree_bind, str(confinement.worktree), WORKSPACE]
    git_pointer = confinement.worktree / ".git"
    if git_pointer.exists():  # merlin commits by it, outside: never let a command redirect it
        args += ["--ro-bind", str(git_pointer), f"{WORKSPACE}/.git"]
    for host_path, inside in confinement.worktree_binds:
        args += ["--ro-bind", str(host_path), inside]
    args += _mask_arguments(confinement)
    if confinement.env_dir is not None:
        bind = "--bind" if confinement.env_writable else "--ro-bind"
        args += [bind, str(confinement.env_dir), ENV_DIR]
    args += ["--chdir", WORKSPACE, "--clearenv"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return args


def _mask_arguments(confinement: Confinement) -> list[str]:
    """The mounts of ``hidden`` and ``read_only_paths``, at the paths the command sees.

    Read-only binds come first so that a hidden path inside a protected one is still
    hidden. A path is resolved first (a mount on a symlink lands on its target); one that
    is gone, or that leads out of the worktree, is skipped: the command cannot reach it
    at ``/workspace`` anyway.
    """
    args: list[str] = []
    for host, inside in _inside_worktree(confinement.worktree, confinement.read_only_paths):
        args += ["--ro-bind", str(host), inside]
    for host, inside in _inside_worktree(confinement.worktree, confinement.hidden):
        if host.is_dir():
            args += ["--tmpfs", inside, "--remount-ro", inside]
        else:  # /dev/null, bound without device access (nodev): opening it fails
            args += ["--ro-bind", "/dev/null", inside]
    return args


def _inside_worktree(worktree: Path, paths: Sequence[Path]) -> list[tuple[Path, str]]:
    root = worktree.resolve()
    found = []
    for path in paths:
        host = (worktree / path).resolve()
        if host.exists() and host.is_relative_to(root):
            relative = host.relative_to(root).as_posix()
            found.append((host, WORKSPACE if relative == "." else f"{WORKSPACE}/{relative}"))
    return found


def unenforceable(confinement: Confinement, config: Sandbox) -> str | None:
    """What ``confinement`` asks that ``config`` cannot give, as a warning; else None.

    With ``mode = "none"`` there are no mounts: hidden paths stay readable, protected
    ones and a read-only worktree writable. Commands still run; merlin records this.
    """
    if config.mode is not SandboxMode.NONE:
        return None
    lost = []
    if confinement.hidden:
        lost.append(f"hide {_names(confinement, confinement.hidden)} from commands")
    if confinement.read_only_paths:
        lost.append(f"keep {_names(confinement, confinement.read_only_paths)} unchanged")
    if not confinement.worktree_writable:
        lost.append("keep the worktree read-only")
    if not lost:
        return None
    return (
        f'warning: [sandbox] mode = "none" cannot {" or ".join(lost)}: commands run '
        "unconfined and reach them; only the tools' own [permissions] checks apply"
    )


def _names(confinement: Confinement, paths: Sequence[Path]) -> str:
    root = confinement.worktree.resolve()
    names = [
        (root / p).resolve().relative_to(root).as_posix()
        if (root / p).resolve().is_relative_to(root)
        else str(p)
        for p in paths[:5]
    ]
    return ", ".join(names) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


@functools.cache
def sandbox_problem() -> str | None:
    """Why bubblewrap cannot be used on this machine, or None when it works.

    Tried once per process: found on PATH, and able to start a command with every
    namespace unshared and a /proc of its own, as a step's sandbox (user namespaces can be
    off in containers, and a container's masked /proc refuses a new one).
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: "
            "`apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), or set "
            '`[sandbox] mode = "none"` in merlin.toml to run step commands unconfined'
        )
    try:
        proc = subprocess.run([bwrap, *PROBE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({bwrap}) could not be started: {exc}"
    if proc.returncode != 0:
        return (
            f"bubblewrap ({bwrap}) cannot create a sandbox here: {proc.stderr.strip()} (user "
            "namespaces may be disabled, or a container's /proc masked: see docs/security.md)"
        )
    return None


def check_sandbox(config: Sandbox) -> None:
    """Raise SandboxUnavailable when ``config`` asks for a sandbox this machine lacks."""
    if config.mode is SandboxMode.BWRAP:
        problem = sandbox_problem()
        if problem:
            raise SandboxUnavailable(problem)


def interpreter() -> Path:
    """The Python setup builds environments on (in their key): the base of merlin's own."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(base).resolve()


def python_mounts(venv: Path | None) -> tuple[Path, ...]:
    """Folders a Python environment needs bound read-only at their own paths.

    For None, merlin's own environment and its base installation. For ``venv`` (a built
    environment, bound elsewhere), the base installation of ``interpreter``, the one
    setup built it on: never what its ``pyvenv.cfg`` names, which setup wrote. Folders
    under /usr are bound with the system already.
    """
    if venv is not None:
        folders = [interpreter().parent.parent, Path(sys.base_prefix)]
    else:
        folders = [Path(sys.prefix), Path(sys.base_prefix)]
        cfg = Path(sys.prefix) / "pyvenv.cfg"  # merlin's own
        for line in cfg.read_text(errors="replace").splitlines() if cfg.is_file() else ():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                folders.append(Path(value.strip()).parent)
    mounts: list[Path] = []
    for folder in (f.resolve() for f in folders):
        if not folder.is_relative_to("/usr") and folder not in mounts:
            mounts.append(folder)
    return tuple(mounts)
