"""One git command as merlin runs it: nothing a worktree holds configures it, no secret in reach.

merlin's own git runs outside the sandbox, as the worker, on worktrees whose files a
model and a repository wrote. Git reads configuration from places such files can reach
(a nested repository's ``.git/config``, through a submodule's path; ``.gitmodules``;
``.gitattributes``), and some of it runs programs. So every git command merlin starts
goes through :func:`git_argv` and :func:`git_environment`:

- **Options** (``SAFE_GIT_OPTIONS``, passed with ``-c``, which git also hands to the git
  processes it starts in submodules): no hooks, no fsmonitor command, no signing, no
  recursion into submodules by any command that could recurse (``submodule.recurse``,
  ``diff.ignoreSubmodules``, ``status.submoduleSummary``, fetch and push).
- **Per command** (``COMMAND_OPTIONS``): ``status`` and the ``diff`` family get
  ``--ignore-submodules=all`` on the command line, the one setting a worktree's
  ``.gitmodules`` (``ignore = none``) cannot override; ``diff`` and ``show`` get
  ``--no-ext-diff --no-textconv``, so no diff program or text converter runs on an
  attempt's files (and a patch is a patch, whatever the user's configuration).
- **Environment** (``GIT_ENV``): an allowlist, never the worker's whole environment:
  the path, home (for the user's own ``~/.gitconfig``), locale and time zone, and git's
  own config-location variables. No API key, token, database or broker URL, and no
  ``GIT_*`` variable that would point git elsewhere. Commands that talk to a remote
  (``REMOTE_COMMANDS``) also get the transport's variables (``REMOTE_GIT_ENV``: the ssh
  agent, proxies, certificates): they run on merlin's bare caches and the user's
  repository, never on a worktree, and recurse into nothing.

- **Filters** (``filter_options``): every filter driver the configuration defines (git-lfs's
  ``filter.lfs``, say) is turned off, with empty ``clean``, ``smudge`` and ``process``
  commands. A worktree's ``.gitattributes`` could otherwise run it, outside the sandbox,
  on any file (``* filter=lfs``), and git-lfs would fetch from a ``.lfsconfig``'s URL. So
  files stored in Git LFS are checked out as their pointer files.

What stays trusted: the configuration of the user's repository, their global and system
git configuration (read, never run by a worktree's file), and the merge drivers they
define, which git 2.39 applies by the attributes of the user's own checkout only.

Nested repositories an attempt makes are removed before merlin stages its change
(``merlin_flow.workspace.staging``); the options above hold even while one exists.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, overload

SAFE_GIT_OPTIONS = (
    *("-c", "core.hooksPath=/dev/null"),  # a repository's, a command's or an attempt's hooks
    *("-c", "core.fsmonitor=false"),  # a command run on every status
    *("-c", "commit.gpgsign=false"),  # gpg with the user's keys
    *("-c", "submodule.recurse=false"),  # checkout, reset, read-tree into submodules
    *("-c", "diff.ignoreSubmodules=all"),  # git status and diff run inside each submodule
    *("-c", "status.submoduleSummary=false"),
    *("-c", "fetch.recurseSubmodules=false"),
    *("-c", "push.recurseSubmodules=no"),
)
"""Given to every git command merlin runs, and by git to the git commands it starts."""
_NO_SUBMODULES = ("--ignore-submodules=all",)
_NO_PROGRAMS = ("--no-ext-diff", "--no-textconv")
COMMAND_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "status": _NO_SUBMODULES,
    "diff": (*_NO_SUBMODULES, *_NO_PROGRAMS),
    "diff-files": _NO_SUBMODULES,
    "diff-index": _NO_SUBMODULES,
    "show": _NO_PROGRAMS,
    "log": _NO_PROGRAMS,
}
"""Options put right after these subcommands: a worktree's ``.gitmodules`` can override
``diff.ignoreSubmodules`` for its submodules, not the command line."""
_GLOBAL_WITH_VALUE = frozenset({"-c", "-C", "--git-dir", "--work-tree", "--namespace"})
REMOTE_COMMANDS = frozenset({"clone", "fetch", "push", "ls-remote"})
"""The subcommands that talk to a remote, and get the transport's variables."""
GIT_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_EXEC_PATH",
)
"""The worker's variables every git command of merlin's sees (and ``LC_*``)."""
REMOTE_GIT_ENV = (
    "SSH_AUTH_SOCK",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_PROXY_COMMAND",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_SSL_NO_VERIFY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "KRB5CCNAME",
    *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
    *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
)
"""What a clone, fetch or push also sees: how to reach and log in to the remote."""


def subcommand_index(args: Sequence[str]) -> int | None:
    """Where git's subcommand is in ``args`` (after global options), or None."""
    index = 0
    while index < len(args):
        word = args[index]
        if word in _GLOBAL_WITH_VALUE:
            index += 2
        elif word.startswith("-"):
            index += 1
        else:
            return index
    return None


def git_argv(args: Sequence[str], cwd: Path | None = None) -> list[str]:
    """The full command line for ``git args`` in ``cwd``: the safe options, the command's own.

    With ``cwd``, the filter drivers its configuration defines are turned off too.
    """
    argv = list(args)
    at = subcommand_index(argv)
    if at is not None:
        argv[at + 1 : at + 1] = COMMAND_OPTIONS.get(argv[at], ())
    filters = filter_options(cwd) if cwd is not None else ()
    return ["git", *SAFE_GIT_OPTIONS, *filters, *argv]


_FILTERS: dict[tuple[tuple[str, int, int], ...], tuple[str, ...]] = {}
_FILTER_KEYS = ("clean", "smudge", "process")


def filter_options(cwd: Path) -> tuple[str, ...]:
    """``-c`` options that turn off each filter driver git's configuration defines in ``cwd``.

    Asked of ``git config`` once per state of the configuration files (their paths, sizes
    and times of change), so a worker pays one process per repository, not per command.
    """
    key = _config_files(cwd)
    found = _FILTERS.get(key)
    if found is None:
        proc = subprocess.run(
            [
                "git",
                "config",
                "--name-only",
                "--get-regexp",
                r"^filter\..*\.(clean|smudge|process)$",
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
            env=git_environment(),
            check=False,
        )
        names = sorted({line[7:].rsplit(".", 1)[0] for line in proc.stdout.splitlines()})
        settings = [
            setting
            for name in names
            for setting in (
                *(f"filter.{name}.{k}=" for k in _FILTER_KEYS),
                f"filter.{name}.required=false",
            )
        ]
        found = tuple(word for setting in settings for word in ("-c", setting))
        _FILTERS[key] = found
    return found


def _config_files(cwd: Path) -> tuple[tuple[str, int, int], ...]:
    """The git configuration files that apply in ``cwd``, each with its size and mtime."""
    home = Path(os.environ.get("HOME", "/nonexistent"))
    xdg = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
    paths = [
        Path(os.environ.get("GIT_CONFIG_SYSTEM", "/etc/gitconfig")),
        Path(os.environ.get("GIT_CONFIG_GLOBAL", home / ".gitconfig")),
        xdg / "git" / "config",
        *_repository_configs(cwd),
    ]
    found = []
    for path in paths:
        try:
            info = path.stat()
        except OSError:
            continue
        found.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(found)


def _repository_configs(cwd: Path) -> list[Path]:
    """The repository's ``config`` (and a worktree's ``config.worktree``) for ``cwd``."""
    for folder in (cwd, *cwd.parents):
        dot_git = folder / ".git"
        if dot_git.is_dir():
            return [dot_git / "config"]
        if dot_git.is_file():
            text = dot_git.read_text(errors="replace")
            git_dir = (folder / text.removeprefix("gitdir:").strip()).resolve()
            common = git_dir / "commondir"
            root = (git_dir / common.read_text().strip()).resolve() if common.is_file() else git_dir
            return [root / "config", git_dir / "config.worktree"]
        if (folder / "HEAD").is_file() and (folder / "objects").is_dir():  # a bare repository
            return [folder / "config"]
    return []


def is_remote(args: Sequence[str]) -> bool:
    """True when ``git args`` talks to a remote (``REMOTE_COMMANDS``)."""
    at = subcommand_index(args)
    return at is not None and args[at] in REMOTE_COMMANDS


def git_environment(
    extra: Mapping[str, str] | None = None,
    remote: bool = False,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one git command: ``GIT_ENV`` (and ``REMOTE_GIT_ENV``), then ``extra``.

    ``environ``: the worker's environment (default ``os.environ``). ``extra`` is merlin's
    own (its identity, a remote's timeouts, a temporary index), and wins.
    """
    source = os.environ if environ is None else environ
    names = (*GIT_ENV, *REMOTE_GIT_ENV) if remote else GIT_ENV
    env = {name: source[name] for name in names if name in source}
    env.update((name, value) for name, value in source.items() if name.startswith("LC_"))
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.update(extra or {})
    return env


@overload
def run_git_process(
    args: Sequence[str],
    cwd: Path,
    extra_env: Mapping[str, str] | None = ...,
    *,
    text: Literal[True] = ...,
    timeout: float | None = ...,
    stdin: str | None = ...,
) -> subprocess.CompletedProcess[str]: ...


@overload
def run_git_process(
    args: Sequence[str],
    cwd: Path,
    extra_env: Mapping[str, str] | None = ...,
    *,
    text: Literal[False],
    timeout: float | None = ...,
    stdin: bytes | None = ...,
) -> subprocess.CompletedProcess[bytes]: ...


def run_git_process(
    args: Sequence[str],
    cwd: Path,
    extra_env: Mapping[str, str] | None = None,
    *,
    text: bool = True,
    timeout: float | None = None,
    stdin: str | bytes | None = None,
) -> subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes]:
    """Run ``git args`` in ``cwd`` as the module doc says; never raises on git's failure.

    ``text``: output decoded as UTF-8, a byte that is not kept as a lone surrogate
    (``surrogateescape``), so that a file name read back and passed to git again names
    the same file. Past ``timeout`` seconds git is killed and TimeoutExpired raised.
    """
    return subprocess.run(
        git_argv(args, cwd),
        cwd=cwd,
        capture_output=True,
        text=text,
        encoding="utf-8" if text else None,
        errors="surrogateescape" if text else None,
        env=git_environment(extra_env, remote=is_remote(args)),
        check=False,
        timeout=timeout,
        input=stdin,
    )
