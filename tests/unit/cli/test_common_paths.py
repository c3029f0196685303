"""Paths no file system takes: exit code 2 and a message naming the option, no OSError.

Issue 45: `merlin run --repo <a name of 300 characters>` was an `OSError` traceback
(ENAMETOOLONG) with exit code 1; so was every other path option, a TaskList path, and a
request in plain words longer than a file name may be.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from merlin_flow.cli.approval import tasklist_file
from merlin_flow.cli.common import path_problem
from merlin_flow.errors import InputError

LONG_NAME = "a" * 300
LONG_PATH = "/tmp/" + "/".join(["b" * 200] * 30)  # every name fits, the whole does not
NUL_PATH = "/tmp/a\0b"


def _path_options() -> Iterator[tuple[list[str], list[str], str]]:
    """(command words, its required arguments, the option) for every path option."""
    root: Any = typer.main.get_command(app)

    def walk(group: Any, words: list[str]) -> Iterator[tuple[list[str], list[str], str]]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, [*words, name])
                continue
            required = [
                "x" for p in command.params if p.param_type_name == "argument" and p.required
            ]
            for param in command.params:
                annotation = param.type_descriptor.annotation
                if param.param_type_name == "option" and (
                    annotation is Path or param.name == "repo"
                ):
                    yield [*words, name], required, param.opts[0]

    yield from walk(root, [])


PATH_OPTIONS = list(_path_options())


def test_the_path_options_are_found() -> None:
    found = {(" ".join(words), option) for words, _, option in PATH_OPTIONS}
    assert {("run", "--repo"), ("submit", "--repo"), ("run", "--config")} <= found
    assert {("plan", "--out"), ("submit", "--junit"), ("agents run", "--repo")} <= found
    assert len(found) >= 20


@pytest.mark.parametrize(
    ("words", "required", "option"),
    PATH_OPTIONS,
    ids=[f"{' '.join(w)} {o}" for w, _, o in PATH_OPTIONS],
)
def test_a_name_too_long_is_a_usage_error_naming_the_option(
    merlin_home: Path, words: list[str], required: list[str], option: str
) -> None:
    result = CliRunner().invoke(app, [*words, *required, option, f"/tmp/{LONG_NAME}"])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = " ".join(result.stderr.split())
    assert message.startswith(f"error: {option}: the path '/tmp/aaa"), message
    assert "has a name of 300 bytes" in message
    assert "over the 255 a file name may have" in message
    assert len(message) < 300  # the path is shown shortened


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (LONG_PATH, ("is 6034 bytes long as an absolute path", "over the 4095 a path may have")),
        (NUL_PATH, ("holds a NUL byte, which no path may",)),
    ],
    ids=["whole-path-too-long", "nul-byte"],
)
@pytest.mark.parametrize("option", ["--repo", "--config", "--junit"])
def test_a_path_too_long_or_with_a_nul_byte_is_a_usage_error(
    merlin_home: Path, tmp_path: Path, value: str, words: tuple[str, ...], option: str
) -> None:
    (tmp_path / "t.yaml").write_text("title: x\nsteps: []\n")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "t.yaml"), option, value])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    if value == NUL_PATH and option != "--repo":  # typer's conversion to a Path refuses it
        assert f"Invalid value for '{option}'" in message
        assert "Value error, embedded null byte" in message
    else:
        assert message.startswith(f"error: {option}: the path "), message
        for word in words:
            assert word in message
    assert not (merlin_home / "merlin.db").exists()  # refused before the store is opened


def test_merlin_config_is_named_with_its_option(
    merlin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERLIN_CONFIG", f"/tmp/{LONG_NAME}")
    result = CliRunner().invoke(app, ["plan", "add a README"])
    assert result.exit_code == 2, result.output
    assert "error: --config (MERLIN_CONFIG): the path" in " ".join(result.stderr.split())


@pytest.mark.parametrize("tasklist", [f"/tmp/{LONG_NAME}.yaml", f"/tmp/{LONG_NAME}", NUL_PATH])
@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_tasklist_path_no_file_system_takes_is_a_usage_error(
    merlin_home: Path, command: str, tasklist: str
) -> None:
    result = CliRunner().invoke(app, [command, tasklist])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()).startswith("error: TASKLIST: the path '/tmp/a")


def test_a_request_longer_than_a_file_name_is_a_request() -> None:
    request = "add a function that doubles its input, and a test of it; " * 6
    assert path_problem(request) is not None  # os.stat() of it: ENAMETOOLONG
    assert tasklist_file(request) is None
    assert tasklist_file("fix the bug\0 in calc.py") is None


def test_a_long_request_is_planned_not_a_traceback(merlin_home: Path) -> None:
    # Before: OSError from Path.is_file(); now the request goes its way (here: refused
    # for want of a terminal to approve its plan on).
    result = CliRunner().invoke(app, ["run", "add a function that doubles its input " * 8])
    assert result.exit_code == 2, result.output
    assert "the request is planned" in " ".join(result.stderr.split())


def test_path_problem_accepts_what_a_file_system_takes(tmp_path: Path) -> None:
    assert path_problem(tmp_path / ("n" * 255)) is None
    assert path_problem("relative/" + "n" * 255) is None
    assert path_problem("~/x") is None
    assert path_problem(tmp_path / ("n" * 256)) is not None
    with pytest.raises(OSError, match="too long"):
        os.stat(tmp_path / ("n" * 256))  # what it predicts


def test_a_git_url_is_not_checked_as_a_path(merlin_home: Path, tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("title: x\nsteps: []\n")
    url = f"file:///nowhere/{LONG_NAME}.git"
    result = CliRunner().invoke(app, ["submit", str(tmp_path / "t.yaml"), "--repo", url])
    assert result.exit_code == 2, result.output
    assert "error: --repo: the path" not in " ".join(result.stderr.split())


def test_a_file_name_made_too_long_of_an_argument_is_a_usage_error(merlin_home: Path) -> None:
    # `agents create NAME` writes NAME.md: the guard's backstop, for a name, not a path
    result = CliRunner().invoke(app, ["agents", "create", LONG_NAME, "--scope", "user"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert message.startswith("error: the file name is too long for the file system: "), message
    assert "Traceback" not in result.output


def test_check_path_is_an_input_error() -> None:
    from merlin_flow.cli.common import check_path

    with pytest.raises(InputError, match="--repo: the path '/tmp/a"):
        check_path(f"/tmp/{LONG_NAME}", "--repo")
    check_path("/tmp/fine", "--repo")
