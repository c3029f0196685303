"""The fast slice of the fuzzing (``tests/fuzz_inputs.py``), and each crash it found.

Every property runs a few hundred derandomized examples here; ``python -m
tests.chaos.fuzz --examples 10000`` is the full run. Each crash the fuzzing found has its
concrete input below, with the error it must give now.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from typer.testing import CliRunner

from merlin_flow.agents.definitions import AgentScope, parse_agent_file
from merlin_flow.config import load_config
from merlin_flow.errors import AgentFileError, ConfigError, TaskListError
from merlin_flow.tasklist import load_tasklist, parse_tasklist
from merlin_flow.tool_config import parse_rule
from tests.conftest import make_repo
from tests.fuzz_inputs import PROPERTIES, SCRIPTS, Property, Unexpected, tasklist_documents

FAST_EXAMPLES = {
    "tasklist file": 150,
    "tasklist data": 300,
    "merlin.toml": 150,
    "permission rule": 500,
    "shell command": 200,
    "text tool calls": 300,
    "toolbox call": 200,
    "model replies": 100,
    "agent file": 100,
}
QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
PHASES = [Phase.explicit, Phase.generate]
"""No shrinking: on inputs this large it takes minutes; the failing input is printed whole."""


def test_every_property_has_a_fast_slice() -> None:
    assert sorted(FAST_EXAMPLES) == sorted(p.name for p in PROPERTIES)


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: p.name)
def test_property(prop: Property) -> None:
    @settings(
        max_examples=FAST_EXAMPLES[prop.name],
        derandomize=True,
        database=None,
        phases=PHASES,
        deadline=None,
        suppress_health_check=QUIET,
    )
    @given(prop.strategy)
    def trial(value: Any) -> None:
        prop.check(value)

    trial()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {
            "app.py": "x = 1\n",
            "merlin.toml": '[[tiers]]\nname = "local"\nmodel = "scripted/s.yaml"\n',
            "s.yaml": "rules: []\n",
        },
    )


def test_cli_refuses_fuzzed_tasklists_with_exit_2(
    merlin_home: Path, repo: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "lists"
    folder.mkdir()

    @settings(
        max_examples=25,
        derandomize=True,
        database=None,
        phases=PHASES,
        deadline=None,
        suppress_health_check=[*QUIET, HealthCheck.function_scoped_fixture],
    )
    @given(tasklist_documents())
    def trial(doc: Any) -> None:
        from merlin_flow.cli.app import app

        path = doc.write(folder)
        try:
            load_tasklist(path).check_submittable()
        except TaskListError:
            pass
        else:
            return  # valid: running it is not what this checks
        result = CliRunner().invoke(app, ["run", str(path), "--repo", str(repo)])
        if result.exit_code != 2 or "Traceback" in result.output:
            raise Unexpected(f"exit {result.exit_code}: {result.output[-800:]}")
        assert "error:" in result.output

    trial()


# ---------------------------------------------------------------- crashes found


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_merlin_toml_that_is_not_utf8(tmp_path: Path) -> None:
    # was UnicodeDecodeError from tomllib.load
    config = write(tmp_path / "merlin.toml", b"\xff[[tiers]]\nname = 'a'\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(config_path=config)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("permissions = 1\n", "permissions"),  # was AttributeError: 'int' ... 'get'
        ("mcp_servers = ['a']\n", "mcp_servers"),  # was AttributeError: ... 'items'
    ],
)
def test_repository_merlin_toml_with_a_section_that_is_not_a_table(
    tmp_path: Path, text: str, problem: str
) -> None:
    write(tmp_path / "merlin.toml", text)
    with pytest.raises(ConfigError, match=problem):
        load_config(repo=tmp_path)


def test_user_merlin_toml_with_permissions_that_are_not_a_table(tmp_path: Path) -> None:
    write(tmp_path / "home" / "merlin.toml", "permissions = 'deny'\n")
    write(tmp_path / "repo" / "merlin.toml", '[[tiers]]\nname = "a"\nmodel = "openai/x"\n')
    with pytest.raises(ConfigError, match="permissions"):
        load_config(repo=tmp_path / "repo", user_home=tmp_path / "home")


@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ("binary.yaml", "cannot read scripted model file"),  # was UnicodeDecodeError
        ("deep.yaml", "nested too deeply"),  # was RecursionError
    ],
)
def test_scripted_tier_with_an_unreadable_script(tmp_path: Path, script: str, problem: str) -> None:
    deep = b"rules: " + b"[" * 1200 + b"]" * 1200 + b"\n"  # as SCRIPTS', less slow to scan
    write(tmp_path / script, deep if script == "deep.yaml" else SCRIPTS[script])
    config = write(
        tmp_path / "merlin.toml", f'[[tiers]]\nname = "a"\nmodel = "scripted/{script}"\n'
    )
    with pytest.raises(ConfigError, match=problem):
        load_config(config_path=config)


def test_agent_file_with_deeply_nested_front_matter(tmp_path: Path) -> None:
    # was RecursionError from the YAML scanner
    text = "---\nname: helper\ndescription: " + "[" * 1200 + "\n---\n"
    path = write(tmp_path / "helper.md", text)
    with pytest.raises(AgentFileError, match="nested too deeply"):
        parse_agent_file(path, AgentScope.USER, None)


@pytest.mark.parametrize("scope", [AgentScope.PROJECT, AgentScope.USER])
def test_agent_file_importing_a_path_with_a_nul_byte(tmp_path: Path, scope: AgentScope) -> None:
    # was ValueError: embedded null byte, from Path.resolve
    path = write(
        tmp_path / ".merlin" / "agents" / "helper.md",
        "---\nname: helper\ndescription: Helps.\n---\n@a\x00b\n",
    )
    with pytest.raises(AgentFileError, match="not a usable path"):
        parse_agent_file(path, scope, tmp_path)


def test_agent_file_with_a_memory_path_with_a_nul_byte(tmp_path: Path) -> None:
    path = write(
        tmp_path / "helper.md", '---\nname: helper\ndescription: d\nmemory: "m\\0.md"\n---\n'
    )
    with pytest.raises(AgentFileError, match="not a usable path"):
        parse_agent_file(path, AgentScope.USER, None)


def test_tasklist_error_does_not_echo_a_huge_key(tmp_path: Path) -> None:
    # was a 5,000-character message: the unknown key repeated whole
    step = {"id": "a", "step_type": "Debug", "description": "d", "x" * 5000: 1}
    path = write(tmp_path / "t.json", json.dumps({"title": "x", "steps": [step]}))
    with pytest.raises(TaskListError) as caught:
        load_tasklist(path)
    message = str(caught.value)
    assert "Extra inputs are not permitted" in message
    assert "(5,000 characters)" in message
    assert len(message) < 400


def test_tasklist_error_lists_at_most_twenty_problems() -> None:
    data = {"title": "x", "steps": [{"id": f"s{i}"} for i in range(30)]}
    with pytest.raises(TaskListError) as caught:
        parse_tasklist(data, "many")
    message = str(caught.value)
    assert message.count("\n") == 21  # the heading, twenty problems, the count of the rest
    assert "... and 40 more problem(s)" in message


def test_permission_rule_error_does_not_echo_a_huge_rule() -> None:
    # was a 10,000-character message: the rule and its tool each repeated whole
    with pytest.raises(ValueError, match=r"unknown tool 'xxx.*\(5,000 characters\)") as caught:
        parse_rule("x" * 5000)
    assert len(str(caught.value)) < 600


@pytest.mark.parametrize(
    "value", ["!!timestamp 20*x26-01-01", "!!int abc", "!!int", "!!bool maybe"]
)
def test_yaml_value_unfit_for_its_tag(tmp_path: Path, value: str) -> None:
    # was AttributeError / ValueError / KeyError from PyYAML's constructors
    tasklist = write(tmp_path / "t.yaml", f"title: {value}\nsteps: []\n")
    with pytest.raises(TaskListError, match="a value unfit for its tag"):
        load_tasklist(tasklist)
    agent = write(tmp_path / "helper.md", f"---\nname: {value}\ndescription: d\n---\n")
    with pytest.raises(AgentFileError, match="a value unfit for its tag"):
        parse_agent_file(agent, AgentScope.USER, None)
    write(tmp_path / "s.yaml", f"rules: [{value}]\n")
    config = write(tmp_path / "merlin.toml", '[[tiers]]\nname = "a"\nmodel = "scripted/s.yaml"\n')
    with pytest.raises(ConfigError, match="cannot read scripted model file"):
        load_config(config_path=config)


def test_config_error_does_not_echo_a_huge_key(tmp_path: Path) -> None:
    # was a 5,000-character message: the unknown key repeated whole
    config = write(
        tmp_path / "merlin.toml", f'[[tiers]]\nname = "a"\nmodel = "openai/x"\n{"x" * 5000} = 1\n'
    )
    with pytest.raises(ConfigError, match="Extra inputs are not permitted") as caught:
        load_config(config_path=config)
    assert len(str(caught.value)) < 400


def test_agent_file_error_does_not_echo_a_huge_model(tmp_path: Path) -> None:
    # was a 5,000-character message: both tier and model repeated whole
    path = write(
        tmp_path / "helper.md",
        f"---\nname: helper\ndescription: d\ntier: a\nmodel: {'x' * 5000}\n---\n",
    )
    with pytest.raises(AgentFileError, match="both tier") as caught:
        parse_agent_file(path, AgentScope.USER, None)
    assert len(str(caught.value)) < 300


def test_agent_file_error_does_not_echo_a_huge_memory_path(tmp_path: Path) -> None:
    # was a 10,000-character message: the path, then the OSError repeating it
    path = write(
        tmp_path / "helper.md", f"---\nname: helper\ndescription: d\nmemory: {'x' * 5000}\n---\n"
    )
    with pytest.raises(AgentFileError, match="File name too long") as caught:
        parse_agent_file(path, AgentScope.USER, None)
    assert len(str(caught.value)) < 400


def test_deep_nesting_is_refused_before_yaml_reads_it(tmp_path: Path) -> None:
    # PyYAML takes time quadratic in the depth to fail: 3,000 brackets took seconds.
    from merlin_flow.tasklist import MAX_FLOW_DEPTH, load_yaml

    path = write(tmp_path / "deep.yaml", "title: x\nsteps: " + "[" * 100_000 + "\n")
    started = time.monotonic()
    with pytest.raises(TaskListError, match="nested too deeply"):
        load_tasklist(path)
    assert time.monotonic() - started < 2
    at_limit = "[" * MAX_FLOW_DEPTH + "]" * MAX_FLOW_DEPTH
    assert load_yaml(f"a: {at_limit}")["a"] is not None  # as deep as allowed: read
    assert load_yaml("a: ']]]] [[[['") == {"a": "]]]] [[[["}  # brackets in strings
