"""Exit commands: which one a step gets, and running it against an attempt's commit.

A step's exit command is, in order of precedence: the step's own ``exit_command``, the
configuration's ``[exit_commands]`` entry for its type, or the default for its type and
the project's kind (detected from marker files at the repository root). In a repository
of several kinds (a Python service with a Node front end), the default is that of the
kinds whose source files the step's description names (``app.ts``: Node), or else of
every kind, one after the other (``sh -c 'python -m pytest -q && npm test'``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from merlin_flow.config import MerlinConfig
from merlin_flow.errors import ConfigError
from merlin_flow.tasklist import StepType, TaskStep
from merlin_flow.workspace.process import CommandResult

if TYPE_CHECKING:
    from merlin_flow.workspace.sandbox import Confinement


class ProjectKind(StrEnum):
    """Kinds of project that have default exit commands."""

    RUST = "rust"
    PYTHON = "python"
    NODE = "node"
    GO = "go"


MARKERS: list[tuple[ProjectKind, tuple[str, ...]]] = [
    (ProjectKind.RUST, ("Cargo.toml",)),
    (ProjectKind.PYTHON, ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt")),
    (ProjectKind.NODE, ("package.json",)),
    (ProjectKind.GO, ("go.mod",)),
]

_S = StepType
DEFAULT_EXIT_COMMANDS: dict[ProjectKind, dict[StepType, str]] = {
    # The seed's defaults: compile check, lints as errors for refactors, the test suite.
    ProjectKind.RUST: {
        _S.DEBUG: "cargo check",
        _S.FEATURE: "cargo check",
        _S.VERIFY: "cargo check",
        _S.REFACTOR: "cargo clippy -- -D warnings",
        _S.TEST: "cargo test",
    },
    # Python has no compile step worth the name: the test suite is the check.
    ProjectKind.PYTHON: {
        _S.DEBUG: "python -m pytest -q",
        _S.FEATURE: "python -m pytest -q",
        _S.VERIFY: "python -m pytest -q",
        _S.REFACTOR: "python -m pytest -q",
        _S.TEST: "python -m pytest -q",
    },
    ProjectKind.NODE: {
        _S.DEBUG: "npm test",
        _S.FEATURE: "npm test",
        _S.VERIFY: "npm run --if-present build",
        _S.REFACTOR: "npm run --if-present lint",
        _S.TEST: "npm test",
    },
    ProjectKind.GO: {
        _S.DEBUG: "go build ./...",
        _S.FEATURE: "go build ./...",
        _S.VERIFY: "go build ./...",
        _S.REFACTOR: "go vet ./...",
        _S.TEST: "go test ./...",
    },
}


SOURCE_SUFFIXES: dict[ProjectKind, tuple[str, ...]] = {
    ProjectKind.RUST: ("rs",),
    ProjectKind.PYTHON: ("py", "pyi"),
    ProjectKind.NODE: ("js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx", "vue", "svelte"),
    ProjectKind.GO: ("go",),
}
"""Source file suffixes of each kind, to tell which kinds a step's description names."""


def detect_project_kinds(repo: Path) -> tuple[ProjectKind, ...]:
    """Every kind whose marker file is at the root of ``repo``, in ``MARKERS`` order."""
    return tuple(k for k, markers in MARKERS if any((repo / m).exists() for m in markers))


def default_exit_command(step: TaskStep, kinds: tuple[ProjectKind, ...]) -> str:
    """The default exit command of ``step`` in a project of ``kinds`` (at least one)."""
    named = [
        kind
        for kind in kinds
        if re.search(rf"\w\.({'|'.join(SOURCE_SUFFIXES[kind])})\b", step.description)
    ]
    commands = list(dict.fromkeys(DEFAULT_EXIT_COMMANDS[k][step.step_type] for k in named or kinds))
    return commands[0] if len(commands) == 1 else "sh -c " + shlex.quote(" && ".join(commands))


def detect_project_kind(repo: Path) -> ProjectKind | None:
    """The project's kind from marker files at its root, or None."""
    for kind, markers in MARKERS:
        if any((repo / marker).exists() for marker in markers):
            return kind
    return None


def exit_command_for(step: TaskStep, config: MerlinConfig, repo: Path) -> str:
    """The exit command ``step`` is verified with; ConfigError when there is none."""
    if step.exit_command:
        return step.exit_command
    if step.step_type in config.exit_commands:
        return config.exit_commands[step.step_type]
    kinds = detect_project_kinds(repo)
    if not kinds:
        raise ConfigError(
            f"step {step.id!r}: no exit command for a {step.step_type} step, and {repo} is not "
            "a Rust, Python, Node or Go project: set `exit_command` on the step or "
            f'`{step.step_type} = "..."` under [exit_commands] in merlin.toml'
        )
    return default_exit_command(step, kinds)


SHELL_PUNCTUATION = frozenset(";&|<>()")
"""Characters of shell control and redirection operators (outside quotes)."""


def shell_syntax(command: str) -> str | None:
    """The shell operator ``command`` uses outside quotes; None for a plain program.

    Operators: ``&&``, ``||``, ``;``, ``|``, ``&``, redirections, ``$(``, backquotes.
    Without ``shell = true`` such a command would not do what it says: split into words,
    ``echo failed; exit 1`` runs ``echo`` with four arguments and passes.
    """
    lexer = shlex.shlex(command, posix=False, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        for token in lexer:
            if token[:1] in ("'", '"'):
                continue  # quoted: a word, whatever it holds
            if set(token) <= SHELL_PUNCTUATION:
                return token
            if "`" in token or "$(" in token:
                return "`" if "`" in token else "$("
    except ValueError:
        return None  # unbalanced quotes: split_command says so when it runs
    return None


def refuse_shell_syntax(command: str, shell: bool, where: str) -> None:
    """ConfigError when ``command`` needs a shell that ``shell = false`` would not give it."""
    found = None if shell else shell_syntax(command)
    if found is not None:
        raise ConfigError(
            f"{where} `{command}` uses shell syntax (`{found}`), and exit commands run "
            "without a shell unless merlin.toml sets `shell = true`: set it (exit commands "
            "then run with /bin/sh -c, in the sandbox), or write the command without "
            f"`{found}` (one program and its arguments; `sh -c '...'` is one)"
        )


def split_command(command: str, shell: bool) -> list[str]:
    """Argv for ``command``: shlex-split, or ``/bin/sh -c`` when the config asks for a shell."""
    if shell:
        return ["/bin/sh", "-c", command]
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(f"cannot parse exit command {command!r}: {exc}") from None
    if not argv:
        raise ConfigError("exit command is empty")
    return argv


def run_exit_command(
    command: str,
    confinement: Confinement,
    config: MerlinConfig,
    stop: Callable[[], bool] | None = None,
) -> CommandResult:
    """Run an exit command in the attempt's worktree, in the sandbox, in its environment.

    A secret's value the user wrote in it is stored as a reference to its variable
    (``redaction.refer_to_secrets``), filled in here: the command runs as written.
    ``stop`` is asked while it runs: True (its job was cancelled) kills it.
    """
    from merlin_flow.store.redaction import fill_secrets
    from merlin_flow.workspace.sandbox import run_confined

    argv = split_command(fill_secrets(command), config.shell)
    timeout = config.limits.exit_command_timeout
    return run_confined(argv, confinement, config.sandbox, timeout, stop=stop)
