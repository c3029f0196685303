"""Exit commands: project kind detection, precedence, defaults, and splitting."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import ConfigError
from merlin_flow.tasklist import StepType, TaskStep
from merlin_flow.workspace.exit_commands import (
    DEFAULT_EXIT_COMMANDS,
    ProjectKind,
    detect_project_kind,
    exit_command_for,
    refuse_shell_syntax,
    shell_syntax,
    split_command,
)


def config(**exit_commands: str) -> MerlinConfig:
    return MerlinConfig(
        tiers=[Tier(name="t", model="m/x")],
        exit_commands={StepType(k): v for k, v in exit_commands.items()},
    )


def make_step(step_type: StepType, exit_command: str | None = None) -> TaskStep:
    return TaskStep(id="s1", step_type=step_type, description="d", exit_command=exit_command)


def project(tmp_path: Path, *markers: str) -> Path:
    for marker in markers:
        (tmp_path / marker).write_text("")
    return tmp_path


@pytest.mark.parametrize(
    ("marker", "kind"),
    [
        ("Cargo.toml", ProjectKind.RUST),
        ("pyproject.toml", ProjectKind.PYTHON),
        ("setup.py", ProjectKind.PYTHON),
        ("requirements.txt", ProjectKind.PYTHON),
        ("package.json", ProjectKind.NODE),
        ("go.mod", ProjectKind.GO),
    ],
)
def test_detect_project_kind(tmp_path: Path, marker: str, kind: ProjectKind) -> None:
    assert detect_project_kind(project(tmp_path, marker)) is kind


def test_detect_no_project_kind(tmp_path: Path) -> None:
    assert detect_project_kind(project(tmp_path, "README.md", "main.c")) is None


def test_markers_only_count_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "Cargo.toml").write_text("")
    assert detect_project_kind(tmp_path) is None


def test_rust_marker_comes_first_of_several(tmp_path: Path) -> None:
    assert (
        detect_project_kind(project(tmp_path, "pyproject.toml", "Cargo.toml")) is ProjectKind.RUST
    )


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("fix the rounding in web/src/price.ts", "npm test"),
        ("fix app/pricing.py and its test", "python -m pytest -q"),
        ("fix prices in the service and the page", "sh -c 'python -m pytest -q && npm test'"),
        ("fix a.py and b.tsx together", "sh -c 'python -m pytest -q && npm test'"),
    ],
)
def test_a_mixed_repository_checks_the_kinds_the_step_names(
    tmp_path: Path, description: str, expected: str
) -> None:
    """A Python service with a Node front end: the kinds whose files the step names, or all."""
    repo = project(tmp_path, "pyproject.toml", "package.json")
    step = TaskStep(id="s1", step_type=StepType.TEST, description=description)
    assert exit_command_for(step, config(), repo) == expected


def test_step_exit_command_wins(tmp_path: Path) -> None:
    repo = project(tmp_path, "Cargo.toml")
    step = make_step(StepType.TEST, exit_command="make check")
    assert exit_command_for(step, config(Test="make test"), repo) == "make check"


def test_config_exit_command_beats_project_default(tmp_path: Path) -> None:
    repo = project(tmp_path, "Cargo.toml")
    cfg = config(Test="make test")
    assert exit_command_for(make_step(StepType.TEST), cfg, repo) == "make test"
    # other step types still get the project default
    assert exit_command_for(make_step(StepType.DEBUG), cfg, repo) == "cargo check"


def test_config_exit_command_needs_no_project_kind(tmp_path: Path) -> None:
    assert exit_command_for(make_step(StepType.VERIFY), config(Verify="true"), tmp_path) == "true"


def test_rust_defaults_match_the_seed(tmp_path: Path) -> None:
    repo = project(tmp_path, "Cargo.toml")
    got = {t: exit_command_for(make_step(t), config(), repo) for t in StepType}
    assert got == {
        StepType.DEBUG: "cargo check",
        StepType.FEATURE: "cargo check",
        StepType.VERIFY: "cargo check",
        StepType.REFACTOR: "cargo clippy -- -D warnings",
        StepType.TEST: "cargo test",
    }


def test_python_default_is_pytest(tmp_path: Path) -> None:
    repo = project(tmp_path, "pyproject.toml")
    for step_type in StepType:
        assert exit_command_for(make_step(step_type), config(), repo) == "python -m pytest -q"


def test_every_kind_has_a_default_for_every_step_type() -> None:
    for kind in ProjectKind:
        assert set(DEFAULT_EXIT_COMMANDS[kind]) == set(StepType)


def test_unknown_project_kind_without_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        exit_command_for(make_step(StepType.REFACTOR), config(Test="x"), tmp_path)
    message = str(info.value)
    assert "step 's1'" in message
    assert "Refactor" in message
    assert "exit_command" in message
    assert "[exit_commands]" in message


def test_split_command_with_shlex() -> None:
    assert split_command("cargo clippy -- -D warnings", shell=False) == [
        "cargo",
        "clippy",
        "--",
        "-D",
        "warnings",
    ]
    assert split_command("python -c 'print(1 + 1)'", shell=False) == [
        "python",
        "-c",
        "print(1 + 1)",
    ]
    # no shell: operators are plain arguments
    assert split_command("make && echo ok", shell=False) == ["make", "&&", "echo", "ok"]


def test_split_command_with_shell() -> None:
    command = "make && echo 'ok' | tee log"
    assert split_command(command, shell=True) == ["/bin/sh", "-c", command]


@pytest.mark.parametrize("command", ["", "   "])
def test_split_empty_command(command: str) -> None:
    with pytest.raises(ConfigError, match="empty"):
        split_command(command, shell=False)


def test_split_unbalanced_quotes() -> None:
    with pytest.raises(ConfigError, match="cannot parse exit command"):
        split_command("echo 'oops", shell=False)


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("echo failed; exit 1", ";"),
        ("pytest -q && ruff check .", "&&"),
        ("make || true", "||"),
        ("pytest | tee log", "|"),
        ("pytest > out.txt", ">"),
        ("pytest 2>&1", ">&"),
        ("echo $(date)", "("),
        ("echo `date`", "`"),
        ("sleep 1 &", "&"),
        ("python -m pytest -q", None),
        ("cargo clippy -- -D warnings", None),
        ("sh -c 'grep -q B b.txt && grep -q C c.txt'", None),  # quoted: one argument
        ('python -c "print(1); print(2)"', None),
        ("grep -q 'a|b' notes.txt", None),
    ],
)
def test_shell_syntax_is_found_outside_quotes(command: str, found: str | None) -> None:
    assert shell_syntax(command) == found


def test_a_command_with_shell_syntax_is_refused_without_a_shell() -> None:
    with pytest.raises(ConfigError, match=r"step s: its exit command `echo failed; exit 1` uses"):
        refuse_shell_syntax("echo failed; exit 1", False, "step s: its exit command")
    refuse_shell_syntax("echo failed; exit 1", True, "step s")  # `shell = true`: it runs so
