"""What an attempt's agent is offered (`step_tools`): allowlists, MCP servers, undone writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.agents.context_window import MAP_HEADING, MAP_MIN_FILES
from merlin_flow.agents.definitions import AgentDefinition, AgentScope
from merlin_flow.agents.loop import StepBrief, first_messages
from merlin_flow.agents.step_tools import (
    allowlisted,
    drop_denied_writes,
    offered_built_ins,
    wanted_servers,
    with_map,
)
from merlin_flow.config import Tier, load_config
from merlin_flow.tool_config import McpServer, PermissionRules
from merlin_flow.tools.permissions import Permissions
from merlin_flow.tools.toolbox import Toolbox
from tests.conftest import make_repo


def _agent(tools: tuple[str, ...] | None) -> AgentDefinition:
    return AgentDefinition(
        name="a", description="d", prompt="p", tools=tools, tier=None, model=None,
        memory=None, scope=AgentScope.BUILTIN, file="a.md",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "allowlist", "expected"),
    [
        ("read_file", None, True),
        ("read_file", ("Read",), True),
        ("grep", ("Read",), True),
        ("write_file", ("Read",), False),
        ("write_file", ("Edit",), True),
        ("run_command", ("Bash",), True),
        ("edit_file", ("write_file",), False),
        ("mcp__calc__add", ("mcp__calc",), True),
        ("mcp__calc__add", ("mcp__calc__add",), True),
        ("mcp__calc__mul", ("mcp__calc__add",), False),
        ("mcp__calculator__add", ("mcp__calc",), False),
        ("read_file", (), False),
    ],
)
def test_an_allowlist_names_tools_or_their_kinds(
    name: str, allowlist: tuple[str, ...] | None, expected: bool
) -> None:
    assert allowlisted(name, allowlist) is expected


def test_permissions_then_the_allowlist_decide_the_built_ins() -> None:
    permissions = Permissions(PermissionRules(deny=["Edit"]))
    assert offered_built_ins(permissions, None) == [
        "read_file", "list_files", "grep", "run_command",
    ]  # fmt: skip
    assert offered_built_ins(permissions, _agent(("Read", "Edit"))) == [
        "read_file", "list_files", "grep",
    ]  # fmt: skip


def test_mcp_servers_start_only_when_some_tool_of_theirs_may_be_offered(tmp_path: Path) -> None:
    config = load_config(tmp_path).model_copy(
        update={"mcp_servers": {"calc": McpServer(command="x"), "web": McpServer(command="y")}}
    )
    closed = config.model_copy(
        update={"permissions": PermissionRules(default="deny", allow=["mcp__calc__add"])}
    )
    assert list(wanted_servers(closed, Permissions(closed.permissions), None)) == ["calc"]
    denied = config.model_copy(update={"permissions": PermissionRules(deny=["mcp__web"])})
    assert list(wanted_servers(denied, Permissions(denied.permissions), None)) == ["calc"]
    assert list(wanted_servers(config, Permissions(config.permissions), _agent(("Read",)))) == []


def test_writes_under_an_edit_deny_are_undone_whatever_the_names(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"uv.lock": "old\n", "app.py": "x = 1\n"})
    (repo / "uv.lock").write_text("changed\n")
    (repo / "café.lock").write_text("new\n")
    (repo / 'x"y.lock').write_text("new\n")
    (repo / "app.py").write_text("x = 2\n")
    config = load_config(repo).model_copy(
        update={"permissions": PermissionRules(deny=["Write(**/*.lock)"])}
    )

    dropped = drop_denied_writes(repo, config)

    assert sorted(path for path, _why in dropped) == sorted(["uv.lock", 'x"y.lock', "café.lock"])
    assert (repo / "uv.lock").read_text() == "old\n"
    assert not (repo / "café.lock").exists()
    assert not (repo / 'x"y.lock').exists()
    assert (repo / "app.py").read_text() == "x = 2\n"


def test_without_a_sandbox_the_rules_that_cannot_reach_commands_are_recorded(
    tmp_path: Path,
) -> None:
    from merlin_flow.agents.step_tools import permission_events
    from merlin_flow.tool_config import Sandbox, SandboxMode

    repo = make_repo(tmp_path / "repo", {"secrets/key": "k\n", "app.py": "x = 1\n"})
    config = load_config(repo).model_copy(
        update={
            "permissions": PermissionRules(deny=["Read(./secrets/**)"]),
            "sandbox": Sandbox(mode=SandboxMode.NONE),
        }
    )
    events = permission_events(repo, config, None)
    assert [kind for kind, _ in events] == ["permissions_unenforced"]
    assert "hide secrets from commands" in events[0][1]
    sandboxed = config.model_copy(update={"sandbox": Sandbox()})
    assert permission_events(repo, sandboxed, None) == []


def _modules(count: int) -> dict[str, str]:
    files = {
        f"pkg/mod_{n:02d}.py": f"def helper_{n}(x):\n    return x + {n}\n" for n in range(count)
    }
    files["pkg/ledger.py"] = "class Ledger:\n    def balance(self):\n        return 0\n"
    return files


def test_the_first_prompt_of_a_step_carries_the_map_ranked_towards_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", _modules(MAP_MIN_FILES + 5))
    brief = StepBrief("s1", "Debug", "Ledger.balance returns 0 for every account", "", "true")
    tier = Tier(name="local", model="scripted/none")
    mapped = with_map(brief, tier, Toolbox(repo))
    assert mapped.repo_map.splitlines()[0].startswith("pkg/ledger.py")
    user = first_messages(mapped, None)[1]["content"]
    assert user.endswith(f"{MAP_HEADING}\n{mapped.repo_map.strip()}")


def test_a_repository_of_a_few_files_gets_no_map(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", _modules(MAP_MIN_FILES - 1))  # and the ledger
    brief = StepBrief("s1", "Debug", "Ledger.balance returns 0 for every account", "", "true")
    mapped = with_map(brief, Tier(name="local", model="scripted/none"), Toolbox(repo))
    assert mapped.repo_map == ""
    assert MAP_HEADING not in first_messages(mapped, None)[1]["content"]
