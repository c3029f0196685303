"""A small MCP server for the tests of ``merlin_flow.tools.mcp``, on the SDK's MCPServer.

Its tools:

- ``add(a, b)``: the sum of two integers;
- ``read_note(name)``: the text of a file relative to its working directory (or an
  absolute path), so a test sees what the server can read: in the sandbox its working
  directory is ``/workspace``, masked files read empty, ``/proc/self/environ`` shows its
  environment; a missing file is an error result naming the working directory;
- ``sleep(seconds)``: answers after that long (a call that outlives its timeout);
- ``crash()``: the server exits at once, without answering.

``python tests/mcp_server.py`` serves over stdio; ``--http PORT`` over streamable HTTP
at ``http://127.0.0.1:PORT/mcp``; ``--hang`` sleeps instead of serving (a server that
never starts); ``--tag TEXT`` does nothing but mark its command line, so that a test can
find its processes.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("merlin-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def read_note(name: str) -> str:
    """Read a text file, relative to the server's working directory."""
    try:
        return Path(name).read_text(errors="replace").replace("\x00", "\n")
    except OSError as exc:
        raise ToolError(f"cannot read {name!r} in {os.getcwd()}: {exc.strerror}") from exc


@server.tool()
async def sleep(seconds: float) -> str:
    """Answer after ``seconds``."""
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def crash() -> str:
    """Exit at once, without answering."""
    os._exit(3)


def main() -> None:
    """Serve over stdio, or over streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on this port")
    parser.add_argument("--hang", action="store_true", help="sleep instead of serving")
    parser.add_argument("--tag", help="ignored: marks the command line")
    options = parser.parse_args()
    if options.hang:
        time.sleep(3600)
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
