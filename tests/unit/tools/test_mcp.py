"""MCP servers as tool sources: real servers (``tests/mcp_server.py``), the real sandbox.

A stdio server runs in bubblewrap as step commands do; a url server is the same test
server serving streamable HTTP. Each start costs a server's Python import (~0.7 s), so
the tests that only call tools share one open set.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from merlin_flow.errors import ToolSourceError
from merlin_flow.tool_config import McpServer, Sandbox, SandboxMode
from merlin_flow.tools.mcp import (
    McpTool,
    open_mcp_tools,
    result_text,
    server_argv,
    tool_name,
)
from merlin_flow.workspace.sandbox import Confinement, python_mounts
from tests.conftest import require_bwrap

SERVER = Path(__file__).resolve().parents[2] / "mcp_server.py"
SECRET = "MERLIN_TEST_SECRET_TOKEN"
BWRAP = Sandbox()


@pytest.fixture(autouse=True, scope="module")
def _needs_bwrap() -> None:
    require_bwrap()


def confine(worktree: Path) -> Confinement:
    """A step's confinement without a project environment: merlin's venv Python on PATH,
    and the test server's folder bound read-only (an installed server, outside the
    worktree)."""
    return Confinement(
        worktree=worktree,
        read_only=(*python_mounts(None), SERVER.parent),
        path=(str(Path(sys.executable).parent),),
    )


def stdio(*args: str, timeout: float = 10, **env: str) -> McpServer:
    return McpServer(command="python", args=[str(SERVER), *args], env=env, timeout=timeout)


def processes_with(tag: str) -> list[int]:
    """The processes whose command line holds ``tag`` (bwrap and the server in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def by_name(tools: list[McpTool]) -> dict[str, McpTool]:
    return {tool.name: tool for tool in tools}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, McpTool]]:
    """One stdio server `demo` in the sandbox, with a secret in the worker's environment."""
    base = tmp_path_factory.mktemp("mcp")
    worktree = base / "worktree"
    worktree.mkdir()
    (worktree / "note.txt").write_text("a note in the worktree\n")
    (base / "beside.txt").write_text("a host file beside the worktree\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET, "sk-worker-secret-0123456789")
        with open_mcp_tools({"demo": stdio(GREETING="hi")}, confine(worktree), BWRAP) as tools:
            yield by_name(tools)


def test_tools_are_offered_as_mcp_server_tool_in_openai_shape(demo: dict[str, McpTool]) -> None:
    assert set(demo) == {
        "mcp__demo__add",
        "mcp__demo__read_note",
        "mcp__demo__sleep",
        "mcp__demo__crash",
    }
    add = demo["mcp__demo__add"]
    assert (add.server, add.tool) == ("demo", "add")
    function = add.schema["function"]
    assert add.schema["type"] == "function"
    assert function["name"] == "mcp__demo__add"
    assert function["description"] == "[MCP server demo] Add two integers."
    parameters = function["parameters"]
    assert parameters["type"] == "object"
    assert parameters["required"] == ["a", "b"]
    assert parameters["properties"]["a"]["type"] == "integer"
    assert demo["mcp__demo__crash"].schema["function"]["parameters"]["properties"] == {}


def test_a_call_returns_the_tools_text(demo: dict[str, McpTool]) -> None:
    assert demo["mcp__demo__add"].call({"a": 2, "b": 3}) == "5"


def test_an_error_result_and_bad_arguments_come_back_as_error_text(
    demo: dict[str, McpTool],
) -> None:
    missing = demo["mcp__demo__read_note"].call({"name": "missing.txt"})
    assert missing.startswith("error: ")
    assert "cannot read 'missing.txt'" in missing
    bad = demo["mcp__demo__add"].call({"a": "two"})
    assert bad.startswith("error: ")
    assert "validation error" in bad


def test_the_server_runs_in_the_sandbox_at_workspace(demo: dict[str, McpTool]) -> None:
    read = demo["mcp__demo__read_note"]
    assert read.call({"name": "note.txt"}) == "a note in the worktree\n"
    assert read.call({"name": "/workspace/note.txt"}) == "a note in the worktree\n"
    assert "in /workspace:" in read.call({"name": "missing.txt"})  # its working directory
    beside = read.call({"name": "../beside.txt"})  # the host folder is not mounted
    assert beside.startswith("error: ")
    assert "No such file" in beside
    assert read.call({"name": "/etc/shadow"}).startswith("error: ")  # masked


def test_the_server_sees_the_allowlist_and_its_env_never_the_workers_secret(
    demo: dict[str, McpTool],
) -> None:
    environ = demo["mcp__demo__read_note"].call({"name": "/proc/self/environ"}).splitlines()
    assert SECRET not in "\n".join(environ)
    assert "sk-worker-secret" not in "\n".join(environ)
    assert "GREETING=hi" in environ  # the server's own `env`
    assert "MERLIN_WORKSPACE=/workspace" in environ


def test_the_toolbox_offers_and_calls_them_behind_its_gate(
    demo: dict[str, McpTool], tmp_path: Path
) -> None:
    from merlin_flow.tools.toolbox import Toolbox

    toolbox = Toolbox(tmp_path, extra=list(demo.values()))
    assert "mcp__demo__add" in toolbox.names
    assert demo["mcp__demo__add"].schema in toolbox.schemas
    assert toolbox.call("mcp__demo__add", '{"a": 2, "b": 3}') == "5"  # JSON, as models send
    gated = Toolbox(
        tmp_path,
        extra=list(demo.values()),
        gate=lambda name, _args: "denied by rule" if name.startswith("mcp__demo__") else None,
    )
    assert gated.call("mcp__demo__add", {"a": 2, "b": 3}) == "error: denied by rule"


def test_a_call_past_its_timeout_is_an_error_and_exit_stops_the_server(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    with open_mcp_tools(
        {"frail": stdio("--tag", tag, timeout=3)}, confine(tmp_path), BWRAP
    ) as tools:
        assert len(processes_with(tag)) >= 2  # bwrap and the server inside it
        tool = by_name(tools)
        started = time.monotonic()
        slow = tool["mcp__frail__sleep"].call({"seconds": 60})
        assert time.monotonic() - started < 6
        assert slow == "error: MCP tool sleep (frail) did not answer in 3 s"
        assert tool["mcp__frail__add"].call({"a": 1, "b": 1}) == "2"  # still serving
    assert processes_with(tag) == []
    assert tool["mcp__frail__add"].call({"a": 1, "b": 1}).startswith("error: ")


def test_a_server_that_hangs_at_start_times_out_and_is_stopped(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    started = time.monotonic()
    with (
        pytest.raises(ToolSourceError, match=r"MCP server 'stuck' .*no answer within 1 s"),
        open_mcp_tools(
            {"stuck": stdio("--hang", "--tag", tag, timeout=1)}, confine(tmp_path), BWRAP
        ),
    ):
        pass
    assert time.monotonic() - started < 8  # 1 s, then stdin closed, 2 s, TERM
    assert processes_with(tag) == []


def test_a_missing_command_fails_the_set_naming_it_and_the_others_are_stopped(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex
    servers = {"good": stdio("--tag", tag), "ghost": McpServer(command="no-such-mcp-server")}
    with (
        pytest.raises(ToolSourceError) as raised,
        open_mcp_tools(servers, confine(tmp_path), BWRAP),
    ):
        pytest.fail("a set with a server that cannot start yields no tools")
    message = str(raised.value)
    assert message.startswith("MCP server 'ghost' (no-such-mcp-server) could not start")
    assert "execvp no-such-mcp-server: No such file or directory" in message  # bwrap's stderr
    assert processes_with(tag) == []


def test_without_the_sandbox_it_runs_in_the_worktree_with_the_allowlist_and_may_die(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET, "sk-worker-secret-0123456789")
    (tmp_path / "note.txt").write_text("unconfined note\n")
    none = Sandbox(mode=SandboxMode.NONE)
    argv = server_argv(stdio(), confine(tmp_path), none)
    assert "env" in argv
    assert "-i" in argv
    with open_mcp_tools({"plain": stdio()}, confine(tmp_path), none) as tools:
        read = by_name(tools)["mcp__plain__read_note"]
        assert read.call({"name": "note.txt"}) == "unconfined note\n"
        environ = read.call({"name": "/proc/self/environ"})
        crashed = by_name(tools)["mcp__plain__crash"].call({})
        assert crashed.startswith("error: MCP server 'plain' closed the connection (it has exited)")
        assert read.call({"name": "note.txt"}).startswith("error: MCP server 'plain'")
    assert SECRET not in environ
    assert f"MERLIN_WORKSPACE={tmp_path}" in environ.splitlines()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The test server on streamable HTTP, outside any sandbox; its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("the HTTP MCP test server did not start")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def test_a_url_server_is_reached_over_streamable_http(http_server: str, tmp_path: Path) -> None:
    remote = McpServer(url=http_server, timeout=10)
    with open_mcp_tools({"remote": remote}, confine(tmp_path), BWRAP) as tools:
        tool = by_name(tools)
        assert tool["mcp__remote__add"].call({"a": 20, "b": 22}) == "42"
        missing = tool["mcp__remote__read_note"].call({"name": "missing.txt"})
    assert missing.startswith("error: ")
    assert str(tmp_path) in missing


def test_an_unreachable_url_raises_tool_source_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    away = {"away": McpServer(url=url, timeout=5)}
    with (
        pytest.raises(ToolSourceError, match=rf"MCP server 'away' at {url} could not be reached"),
        open_mcp_tools(away, confine(tmp_path), BWRAP),
    ):
        pass


def test_no_servers_start_nothing(tmp_path: Path) -> None:
    with open_mcp_tools({}, confine(tmp_path), BWRAP) as tools:
        assert tools == []


def test_tool_names_keep_to_openais_alphabet_and_length_and_stay_apart() -> None:
    taken: set[str] = set()
    assert tool_name("docs", "search.v2 (beta)", taken) == "mcp__docs__search_v2__beta_"
    long = tool_name("docs", "x" * 80, taken)
    assert len(long) == 64
    assert long.startswith("mcp__docs__xxx")
    again = tool_name("docs", "x" * 81, taken)  # the same after the cut: numbered
    assert len(again) == 64
    assert again.endswith("_2")
    assert again != long
    assert tool_name("docs", "search_v2__beta_", taken) == "mcp__docs__search_v2__beta__2"


def test_result_text_describes_parts_and_marks_errors() -> None:
    from mcp_types import (
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        TextContent,
        TextResourceContents,
    )

    result = CallToolResult(
        content=[
            TextContent(text="first"),
            ImageContent(data="aGVsbG8h", mime_type="image/png"),
            EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="inner")),
        ]
    )
    assert result_text(result) == (
        "first\n[image: image/png, 6 bytes, not shown]\n[resource file:///a.txt]\ninner"
    )
    assert result_text(CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    assert result_text(CallToolResult(content=[])) == "(no output)"
    failed = CallToolResult(content=[TextContent(text="boom")], is_error=True)
    assert result_text(failed) == "error: boom"


def test_a_loop_that_outlives_its_close_is_closed_by_its_own_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stuck server can hold the loop past close()'s wait; the loop must still be closed
    # when its thread ends, or its self-pipe leaks into whatever runs next.
    import asyncio

    import merlin_flow.tools.mcp as mcp

    monkeypatch.setattr(mcp, "STOP_SECONDS", 0.1)
    thread = mcp._LoopThread()

    async def hog() -> None:
        time.sleep(1.0)  # blocks the loop itself, as a stuck call would

    thread.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(hog(), loop=thread.loop))
    time.sleep(0.05)
    thread.close()
    assert thread.closed
    assert not thread.loop.is_closed()  # close() gave up waiting
    thread._thread.join(5)
    assert thread.loop.is_closed()
