"""MCP servers as tool sources: `[mcp_servers.NAME]` started per attempt, their tools offered.

``open_mcp_tools`` starts every configured server for one attempt and yields one
``McpTool`` per tool listed, named ``mcp__<server>__<tool>``, an OpenAI function call
that passes the permission rules and journal of the built-in tools; on exit all stop.

- A stdio server (``command``/``args``) runs in the step's sandbox as a command would:
  the worktree at ``/workspace``, the allowlisted environment plus the server's ``env``,
  no secret, no network unless ``[sandbox] network``, the same limits; it dies with it.
- A ``url`` server is reached over streamable HTTP by the worker itself: nothing starts,
  and the sandbox does not bound what that server reaches.

The MCP SDK is asynchronous: per open set, an event loop runs in a thread of its own, a
task there holds each server's session open, calls are submitted to that loop, and every
wait is bounded by the server's ``timeout`` (start and listing together; each call).
A failed start raises ``ToolSourceError`` (stdio: with stderr's tail); calls: ``error: ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, TypeVar

from merlin_flow.errors import ToolSourceError
from merlin_flow.tool_config import McpServer, Sandbox, SandboxMode
from merlin_flow.workspace.sandbox import (
    Confinement,
    bwrap_arguments,
    check_sandbox,
    command_environment,
    resource_limits,
)

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client import Transport
    from mcp_types import CallToolResult, ContentBlock, Tool

MAX_NAME_CHARS = 64
"""The longest function name OpenAI's API accepts."""
MAX_OUTPUT_CHARS = 100_000
"""A tool's reply is cut past this many characters."""
STDERR_TAIL_CHARS = 2000
"""How much of a stdio server's stderr an error quotes."""
STOP_SECONDS = 10.0
"""How long the SDK may take to stop a server: stdin closed, 2 s, TERM, 2 s, KILL."""
MAX_LIST_PAGES = 100
"""Pages of a tool list read at most: a server that pages forever cannot hang a start."""

_T = TypeVar("_T")


class McpTool:
    """One tool of an MCP server, as the agent is offered it (an ``ExternalTool``)."""

    def __init__(self, name: str, schema: dict[str, Any], server: _Server, tool: str) -> None:
        """``name`` and ``schema`` as the model sees them; ``tool`` as the server knows it."""
        self.name = name
        """``mcp__<server>__<tool>``, reduced to ``[A-Za-z0-9_-]`` and 64 characters."""
        self.schema = schema
        """The OpenAI function-call schema, with the server's input schema as parameters."""
        self.server = server.name
        """The server's name in ``[mcp_servers]``."""
        self.tool = tool
        """The tool's own name on its server."""
        self._server = server

    def call(self, arguments: dict[str, Any]) -> str:
        """Call the tool: its text content, or ``error: ...``; never raises, never hangs."""
        return self._server.call(self.tool, arguments)


@contextlib.contextmanager
def open_mcp_tools(
    servers: Mapping[str, McpServer], confinement: Confinement, sandbox: Sandbox
) -> Iterator[list[McpTool]]:
    """Start every server of ``servers`` and yield their tools; stop them all on exit.

    Stdio servers are confined by ``confinement`` and ``sandbox`` (the step's own).
    Raises ``ToolSourceError`` when a server cannot start or list its tools (after
    stopping the others), ``SandboxUnavailable`` when bubblewrap is configured but
    cannot run here.
    """
    if not servers:
        yield []
        return
    if any(config.command is not None for config in servers.values()):
        check_sandbox(sandbox)
    loop = _LoopThread()
    opened: list[_Server] = []
    try:
        opened += [_Server(name, cfg, confinement, sandbox, loop) for name, cfg in servers.items()]
        longest = max(config.timeout for config in servers.values())
        try:
            listings = loop.run(_start_all(opened), longest + STOP_SECONDS)
        except TimeoutError:  # each start is bounded in the loop: only a stuck loop lands here
            raise ToolSourceError(f"MCP servers did not start within {longest:g} s") from None
        tools: list[McpTool] = []
        taken: set[str] = set()
        for server, listing in zip(opened, listings, strict=True):
            if isinstance(listing, BaseException):
                raise ToolSourceError(server.failure(listing)) from listing
            tools += [server.tool(tool, taken) for tool in listing]
        yield tools
    finally:
        with contextlib.suppress(TimeoutError):
            loop.run(_stop_all(opened), STOP_SECONDS * 2)
        loop.close()


def tool_name(server: str, tool: str, taken: set[str]) -> str:
    """``mcp__<server>__<tool>`` in ``[A-Za-z0-9_-]``, at most 64 characters, not in ``taken``."""
    name = unique = re.sub(r"[^A-Za-z0-9_-]", "_", f"mcp__{server}__{tool}")[:MAX_NAME_CHARS]
    number = 1
    while unique in taken:  # two tools the reduction made alike: number the later ones
        number += 1
        unique = name[: MAX_NAME_CHARS - len(str(number)) - 1] + f"_{number}"
    taken.add(unique)
    return unique


def function_schema(name: str, server: str, tool: Tool) -> dict[str, Any]:
    """The OpenAI function-call schema of ``tool``, offered as ``name``."""
    parameters = dict(tool.input_schema)
    parameters.setdefault("type", "object")
    if parameters["type"] == "object":
        parameters.setdefault("properties", {})
    about = tool.description or tool.title or tool.name
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"[MCP server {server}] {about}",
            "parameters": parameters,
        },
    }


def result_text(result: CallToolResult) -> str:
    """A tool result as the model reads it: its text, other parts described, errors marked."""
    text = "\n".join(part for part in map(_content_text, result.content) if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if result.is_error:
        text = f"error: {text or 'the tool failed and said nothing'}"
    if len(text) > MAX_OUTPUT_CHARS:
        return text[:MAX_OUTPUT_CHARS] + f"\n[truncated at {MAX_OUTPUT_CHARS} characters]"
    return text or "(no output)"


def _content_text(block: ContentBlock) -> str:
    import mcp_types as types

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        kind = resource.mime_type or "binary"
        return f"[resource {resource.uri}: {kind}, {len(resource.blob) * 3 // 4} bytes, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def server_argv(config: McpServer, confinement: Confinement, sandbox: Sandbox) -> list[str]:
    """The command line of a stdio server: in bubblewrap, or under ``env -i`` without it.

    Either way it sees only ``command_environment`` plus the server's ``env``.
    """
    if config.command is None:
        raise ValueError("a url server has no command line")
    env = {**command_environment(confinement, sandbox), **config.env}
    command = [config.command, *config.args]
    if sandbox.mode is SandboxMode.NONE:
        argv = ["env", "-i", *(f"{name}={value}" for name, value in env.items()), *command]
    else:
        argv = [*bwrap_arguments(confinement, env), "--", *command]
    return resource_limits(sandbox).wrap(argv)


class _LoopThread:
    """An asyncio event loop running in a daemon thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._thread = threading.Thread(target=self._serve, name="mcp", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Run the loop; once stopped, end its tasks and close it, as ``asyncio.run`` does."""
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """Run ``coroutine`` on the loop; TimeoutError (and it is cancelled) past ``timeout``."""
        if self.closed:
            coroutine.close()
            raise RuntimeError("the MCP servers are stopped")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        """Stop the loop (every server is stopped by then); its thread closes it."""
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_SECONDS)


class _Server:
    """One MCP server of an open set: its session, held open by a task on the loop."""

    def __init__(
        self,
        name: str,
        config: McpServer,
        confinement: Confinement,
        sandbox: Sandbox,
        loop: _LoopThread,
    ) -> None:
        self.name = name
        self.config = config
        self.timeout = config.timeout
        self._loop = loop
        self._argv = server_argv(config, confinement, sandbox) if config.command else None
        self._cwd = confinement.worktree
        self._stderr: IO[str] | None = None
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> list[Tool]:
        """Start the server (or connect to it), initialise it and list its tools."""
        ready: asyncio.Future[list[Tool]] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(ready, self._stop))
        return await ready

    async def _hold(self, ready: asyncio.Future[list[Tool]], stop: asyncio.Event) -> None:
        import anyio
        from mcp import Client

        scope = anyio.CancelScope(deadline=anyio.current_time() + self.timeout)
        try:
            with scope:
                transport, timeout = self._transport(), self.timeout
                async with Client(transport, read_timeout_seconds=timeout, cache=None) as client:
                    tools = await _list_tools(client)
                    scope.deadline = math.inf  # started: the session stays open until stopped
                    self._client = client
                    ready.set_result(tools)
                    await stop.wait()
        except Exception as exc:  # reported by start(); after it, the session just ends
            if not ready.done():
                ready.set_exception(exc)
        finally:
            self._client = None
            if not ready.done():
                ready.set_exception(TimeoutError(f"no answer within {self.timeout:g} s"))

    def _transport(self) -> Transport | str:
        if self._argv is None:
            assert self.config.url is not None
            return self.config.url
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        # Closed by stop(): it outlives this call, as the server does.
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        # The SDK adds the worker's HOME, PATH, USER... to this: they reach bwrap (or env
        # -i), which clears them; the server sees only the variables in its argv.
        launch = StdioServerParameters(command=self._argv[0], args=self._argv[1:], cwd=self._cwd)
        return stdio_client(launch, errlog=self._stderr)

    async def stop(self) -> None:
        """Stop the server (or end the session) and wait for it to be gone."""
        if self._stop is not None and self._task is not None:
            self._stop.set()
            await asyncio.wait({self._task}, timeout=STOP_SECONDS)
        if self._stderr is not None:
            self._stderr.close()

    def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """Call ``tool`` from any thread; its reply text or ``error: ...``."""
        try:
            return self._loop.run(self._call(tool, arguments), self.timeout + STOP_SECONDS)
        except TimeoutError:
            return self._timed_out(tool)
        except RuntimeError as exc:  # the set is closed: the attempt is over
            return f"error: MCP server {self.name!r}: {exc}"

    async def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        import anyio
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._client
        if client is None:
            return f"error: MCP server {self.name!r} is not running{self._stderr_note()}"
        try:
            with anyio.fail_after(self.timeout):
                result = await client.call_tool(tool, arguments, read_timeout_seconds=self.timeout)
        except TimeoutError:
            return self._timed_out(tool)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return self._timed_out(tool)
            if exc.code == CONNECTION_CLOSED:
                return (
                    f"error: MCP server {self.name!r} closed the connection (it has exited)"
                    f"{self._stderr_note()}"
                )
            return f"error: MCP server {self.name!r} refused the call of {tool}: {exc.message}"
        except Exception as exc:
            return f"error: MCP server {self.name!r} failed on {tool}: {_reason(exc)}"
        return result_text(result)

    def tool(self, tool: Tool, taken: set[str]) -> McpTool:
        """The ``McpTool`` of one listed tool, named apart from those in ``taken``."""
        name = tool_name(self.name, tool.name, taken)
        return McpTool(name, function_schema(name, self.name, tool), self, tool.name)

    def _timed_out(self, tool: str) -> str:
        return f"error: MCP tool {tool} ({self.name}) did not answer in {self.timeout:g} s"

    def failure(self, error: BaseException) -> str:
        """Why the server could not be used, for ``ToolSourceError``."""
        if self._argv is None:
            failed = f"at {self.config.url} could not be reached or did not list its tools"
        else:
            failed = f"({self.config.command}) could not start or did not list its tools"
        return f"MCP server {self.name!r} {failed}: {_reason(error)}{self._stderr_note()}"

    def _stderr_note(self) -> str:
        """The end of a stdio server's stderr, as the tail of an error ("" if none)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        fd = self._stderr.fileno()  # pread: the server writes at the shared offset
        size = os.fstat(fd).st_size
        start = max(0, size - 4 * STDERR_TAIL_CHARS)
        tail = os.pread(fd, size - start, start).decode("utf-8", errors="replace")
        tail = tail.strip()[-STDERR_TAIL_CHARS:]
        return f"; its stderr ends:\n{tail}" if tail else ""


async def _start_all(servers: list[_Server]) -> list[list[Tool] | BaseException]:
    return await asyncio.gather(*(server.start() for server in servers), return_exceptions=True)


async def _stop_all(servers: list[_Server]) -> None:  # each stop is bounded
    await asyncio.gather(*(server.stop() for server in servers), return_exceptions=True)


async def _list_tools(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _reason(error: BaseException) -> str:
    """A short reason for ``error``, from the innermost exceptions of a group."""
    from mcp import MCPError

    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in error.exceptions)
    if isinstance(error, MCPError):
        return error.message
    if isinstance(error, TimeoutError | OSError) and str(error):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
