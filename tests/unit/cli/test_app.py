"""The command line's conventions: --version, -h, usage lines, flags, whole summaries."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from merlin_flow import __version__
from merlin_flow.cli.app import app

runner = CliRunner()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0
    assert result.output == f"merlin {__version__}\n"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_h_and_help_both_show_a_commands_help(flag: str) -> None:
    result = runner.invoke(app, ["run", flag])
    assert result.exit_code == 0
    assert result.output.startswith("Usage: merlin run [OPTIONS] TASKLIST|REQUEST\n")
    assert "-h, --help" in result.output


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (["status"], "merlin status [OPTIONS] JOB_ID"),
        (["resume"], "merlin resume [OPTIONS] JOB_ID"),
        (["submit"], "merlin submit [OPTIONS] TASKLIST|REQUEST"),
        (["costs"], "merlin costs [OPTIONS] [JOB_ID]"),
        (["db", "upgrade"], "merlin db upgrade [OPTIONS]"),
        (["agents", "list"], "merlin agents list [OPTIONS]"),
        (["agents", "show"], "merlin agents show [OPTIONS] NAME"),
        (["agents", "create"], "merlin agents create [OPTIONS] NAME"),
        (["agents", "edit"], "merlin agents edit [OPTIONS] NAME"),
        (["agents", "rm"], "merlin agents rm [OPTIONS] NAME"),
        (["agents", "init"], "merlin agents init [OPTIONS]"),
        (["agents", "run"], "merlin agents run [OPTIONS] NAME PROMPT"),
    ],
)
def test_usage_names_arguments_in_capitals_with_optional_ones_in_brackets(
    command: list[str], usage: str
) -> None:
    result = runner.invoke(app, [*command, "-h"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"Usage: {usage}"
    assert "{" not in result.output.splitlines()[0]


def test_flags_show_no_value_and_refuse_one() -> None:
    help_text = runner.invoke(app, ["status", "-h"]).output
    assert re.search(r"^  --json\s+Print JSON", help_text, re.MULTILINE), help_text
    assert "<bool>" not in help_text
    refused = runner.invoke(app, ["list", "--json", "true"])
    assert refused.exit_code == 2
    assert "unexpected extra argument" in refused.output


def test_the_command_list_gives_each_first_sentence_whole() -> None:
    output = runner.invoke(app, ["--help"]).output
    commands = output.split("Commands:\n", 1)[1]
    assert "..." not in commands
    joined = " ".join(commands.split())
    assert (
        "Enqueue a TaskList, or a request in plain words, for the workers; print the job id."
        in joined
    )
    assert "Continue a failed or cancelled job from its first unverified step, on the workers." in (
        joined
    )


@pytest.mark.parametrize(
    ("queues", "name"),
    [
        ("control,llm,verify", "merlin-all-abc123@%h"),
        ("verify", "merlin-verify-abc123@%h"),
        ("llm, control", "merlin-control-llm-abc123@%h"),
    ],
)
def test_a_worker_is_named_for_its_role(queues: str, name: str) -> None:
    from merlin_flow.cli.operations import worker_name

    assert worker_name(queues, "abc123") == name


def test_the_agents_command_list_gives_each_first_sentence_whole() -> None:
    output = runner.invoke(app, ["agents", "--help"]).output
    commands = " ".join(output.split("Commands:\n", 1)[1].split())
    assert "..." not in commands
    for sentence in (
        "list List the agents in effect: name, scope, tools, tier or model, description.",
        "show Show an agent's definition and the whole prompt it gives a step.",
        "create Write a new agent file from a template, to edit next; refuse if it exists.",
        "edit Open an agent's file in $VISUAL or $EDITOR, then check that it still loads.",
        "rm Delete an agent's file; --scope says which when both the project and user have it.",
        "init Copy the builtin starter agents into the project's agent folder, to edit them there.",
        "run Run one step with an agent, in this process, as `merlin run` runs a TaskList.",
    ):
        assert sentence in commands
    top = " ".join(runner.invoke(app, ["--help"]).output.split())
    assert "agents Agents: Markdown files with YAML front matter that give a step its prompt" in top


def _merlin_script() -> str:
    """The `merlin` console script of this environment."""
    import sys
    from pathlib import Path

    return str(Path(sys.executable).parent / "merlin")


@pytest.mark.parametrize(
    ("shell", "line"),
    [
        ("bash", "complete -o default -F _merlin_completion merlin"),
        ("zsh", "#compdef merlin"),
        ("fish", "complete --command merlin --no-files"),
    ],
)
def test_each_shell_gets_a_completion_script(shell: str, line: str) -> None:
    import os
    import subprocess

    env = {**os.environ, "_MERLIN_COMPLETE": f"source_{shell}"}
    result = subprocess.run(
        [_merlin_script()], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert line in result.stdout


def test_show_completion_prints_the_script_of_the_shell_it_runs_in() -> None:
    import subprocess

    shown = subprocess.run(  # `; :` keeps bash the parent, not replaced by merlin
        ["bash", "-c", f"{_merlin_script()} --show-completion; :"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "complete -o default -F _merlin_completion merlin" in shown.stdout, shown.stderr


def test_completion_offers_commands_and_job_statuses() -> None:
    import os
    import subprocess

    def complete(*words: str) -> list[str]:
        env = {
            **os.environ, "_MERLIN_COMPLETE": "complete_bash",
            "COMP_WORDS": " ".join(["merlin", *words]), "COMP_CWORD": str(len(words)),
        }  # fmt: skip
        result = subprocess.run(
            [_merlin_script()], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        return result.stdout.split()

    assert complete("li") == ["list"]
    assert "--status" in complete("list", "--")
    assert complete("list", "--status", "f") == ["failed"]
    assert complete("list", "--status", "") == [
        "planning", "awaiting_approval", "pending", "running", "completed",
        "partially_completed", "failed", "cancelled", "budget_exceeded", "rejected", "parked",
    ]  # fmt: skip


def test_install_and_show_completion_are_offered() -> None:
    output = runner.invoke(app, ["--help"]).output
    assert "--install-completion" in output
    assert "--show-completion" in output
