"""A small OpenAI-compatible chat server on 127.0.0.1, for tests over real HTTP.

It answers ``POST /v1/chat/completions`` from a queue of replies the test gives it
(a message, an HTTP error, or a hang), records every request it received, and holds
the rules real servers hold and litellm's own mocks do not:

- an assistant message must carry a string ``content`` (llama.cpp's chat templates fail
  on a missing or null one: HTTP 500, as the real server answers);
- with ``api_key`` set, a request without ``Authorization: Bearer <api_key>`` gets 401;
- with ``window`` set, it counts each request's prompt tokens its own way (the JSON of
  its messages and tools, ``CHARS_PER_TOKEN`` characters a token: more than merlin's
  tokenizers count, as a model with an unknown tokenizer would), reports that count as
  the usage's ``prompt_tokens``, and refuses a request over the window with HTTP 400 and
  OpenAI's "maximum context length" message, as vLLM and llama.cpp do.

With an empty queue it answers a plain "done" message.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One answer: a message (status 200), or an error status with a body."""

    status: int = 200
    message: dict[str, Any] | None = None
    error: str = "server error"
    delay: float = 0.0
    usage: tuple[int, int] = (12, 5)


def text(content: str) -> Reply:
    """A reply with text and no tool calls."""
    return Reply(message={"role": "assistant", "content": content})


def tool_call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Reply:
    """A reply that calls one tool, with null content as OpenAI's API sends it."""
    return Reply(
        message={
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
    )


def error(status: int, message: str = "server error") -> Reply:
    """An HTTP error answer."""
    return Reply(status=status, error=message)


@dataclass
class Request:
    """What the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


CHARS_PER_TOKEN = 3.5
"""How the server counts prompt tokens when it enforces a window."""


def prompt_tokens(body: dict[str, Any]) -> int:
    """The server's count of a request's prompt: its messages and tools as JSON."""
    text = json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass
class ModelServer:
    """The server; use as a context manager, then read ``url`` and ``requests``."""

    model: str = "tiny-model"
    api_key: str | None = None
    window: int | None = None
    respond: Callable[[dict[str, Any]], Reply | None] | None = None
    """Answers a request's body itself when it returns a reply (before the queue)."""
    replies: deque[Reply] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:<port>/v1``."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def queue(self, *replies: Reply) -> None:
        """Answer the next requests with ``replies``, in order."""
        self.replies.extend(replies)

    def __enter__(self) -> ModelServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        _close_left_event_loop()

    def answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for ``request``."""
        self.requests.append(request)
        authorization = request.headers.get("authorization")
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            return 401, _error_body("Invalid API key", "invalid_api_key")
        for message in request.body.get("messages", []):
            if message.get("role") == "assistant" and not isinstance(message.get("content"), str):
                return 500, _error_body("chat template: assistant content must be a string")
        counted = prompt_tokens(request.body) if self.window is not None else None
        if self.window is not None and counted is not None and counted > self.window:
            return 400, _error_body(
                f"This model's maximum context length is {self.window} tokens. However, your "
                f"messages resulted in {counted} tokens.",
                "context_length_exceeded",
            )
        reply = self.respond(request.body) if self.respond is not None else None
        if reply is None:
            reply = self.replies.popleft() if self.replies else text("done")
        if reply.delay:
            time.sleep(reply.delay)
        if reply.status != 200:
            return reply.status, _error_body(reply.error)
        prompt, completion = reply.usage
        prompt = counted if counted is not None else prompt
        return 200, {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": reply.message, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


def _error_body(message: str, code: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "code": code}}


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {key.lower(): value for key, value in self.headers.items()}
            status, answer = server.answer(Request(self.path, headers, body))
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout): nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _close_left_event_loop() -> None:
    """Close the event loop litellm's HTTP path leaves set (unclosed) on the calling thread.

    Left open, it is collected whenever a later test in the process (``anyio.run``) sets
    a loop of its own, and its self-pipe sockets fail that test with a ResourceWarning.
    """
    policy = asyncio.get_event_loop_policy()
    loop = getattr(getattr(policy, "_local", None), "_loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_running():
        loop.close()
        policy.set_event_loop(None)
