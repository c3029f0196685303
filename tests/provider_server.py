"""A local HTTP server that plays a provider's recorded exchanges, for tests over real HTTP.

An exchange (``tests/fixtures/providers/<provider>/<name>.json``, described in that
folder's README) is what one request should look like and the answer the provider gives
it: an HTTP status and a JSON body in the provider's own wire format. The server answers
each POST with the next exchange's status and body, and records every request it
received (path, headers, JSON body), so that a test sees the bytes litellm really sent:
OpenAI's chat completions, Anthropic's Messages API, Gemini's generateContent.

Like the real services, it answers 404 to a path other than the one the exchange
expects, and a request beyond the recorded ones gets 500 with a body saying so.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "providers"


@dataclass(frozen=True)
class Exchange:
    """One recorded request and answer: the request's expected facts, the response."""

    expect: dict[str, Any]
    """``path``; ``headers`` (name: exact value); ``body`` (JSON pointer: exact value);
    ``body_contains`` (JSON pointer: a substring of the string found there)."""
    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Recording:
    """A fixture file: where its shapes come from, and its exchanges in order."""

    provider: str
    name: str
    source: str
    exchanges: list[Exchange]
    conversation: list[dict[str, Any]]
    """Messages a test sends (OpenAI form), for recordings of what merlin sends back."""


def load(provider: str, name: str) -> Recording:
    """The recording ``tests/fixtures/providers/<provider>/<name>.json``."""
    data = json.loads((FIXTURES / provider / f"{name}.json").read_text())
    exchanges = [
        Exchange(item["request"], item["response"]["status"], item["response"]["body"])
        for item in data["exchanges"]
    ]
    return Recording(provider, name, data["source"], exchanges, data.get("conversation", []))


@dataclass
class Request:
    """What the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def pointer(document: Any, path: str) -> Any:
    """The value at JSON pointer ``path`` (RFC 6901; ``-1`` also names a list's last item)."""
    value = document
    for token in path.split("/")[1:] if path else []:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    return value


def mismatches(exchange: Exchange, request: Request) -> list[str]:
    """How ``request`` differs from what ``exchange`` expects; empty when it matches."""
    expect = exchange.expect
    found: list[str] = []
    if "path" in expect and request.path != expect["path"]:
        found.append(f"path {request.path!r}, expected {expect['path']!r}")
    for name, value in expect.get("headers", {}).items():
        if request.headers.get(name.lower()) != value:
            found.append(f"header {name}: {request.headers.get(name.lower())!r} != {value!r}")
    for path, value in expect.get("body", {}).items():
        try:
            actual = pointer(request.body, path)
        except (KeyError, IndexError, TypeError, ValueError):
            found.append(f"body{path}: missing, expected {value!r}")
            continue
        if actual != value:
            found.append(f"body{path}: {actual!r} != {value!r}")
    for path, part in expect.get("body_contains", {}).items():
        try:
            actual = pointer(request.body, path)
        except (KeyError, IndexError, TypeError, ValueError):
            found.append(f"body{path}: missing, expected to contain {part!r}")
            continue
        if not isinstance(actual, str) or part not in actual:
            found.append(f"body{path}: {actual!r} does not contain {part!r}")
    return found


@dataclass
class ProviderServer:
    """The server; use as a context manager, then read ``url`` and ``requests``."""

    pending: deque[Exchange] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    served: list[Exchange] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The server's root, ``http://127.0.0.1:<port>`` (a tier's `api_base` adds to it)."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def play(self, recording: Recording) -> None:
        """Answer the next requests with ``recording``'s exchanges, in order."""
        self.pending.extend(recording.exchanges)

    def check(self) -> list[str]:
        """Every way the requests received differ from the recording played.

        Each request is compared with its exchange's expectations; a request beyond the
        recorded ones, and a recorded exchange never asked for, are differences too.
        """
        found = []
        for number, request in enumerate(self.requests, 1):
            if number > len(self.served):
                found.append(f"request {number}: beyond the recorded exchanges")
                continue
            exchange = self.served[number - 1]
            found += [f"request {number}: {problem}" for problem in mismatches(exchange, request)]
        if self.pending:
            found.append(f"{len(self.pending)} recorded exchange(s) never requested")
        return found

    def __enter__(self) -> ProviderServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for ``request``: the next exchange's."""
        self.requests.append(request)
        if not self.pending:
            return 500, {"error": {"message": "no recorded exchange left for this request"}}
        exchange = self.pending.popleft()
        self.served.append(exchange)
        expected_path = exchange.expect.get("path")
        if expected_path is not None and request.path != expected_path:
            return 404, {"error": {"message": f"no route {request.path}"}}
        return exchange.status, exchange.body


def _handler(server: ProviderServer) -> type[BaseHTTPRequestHandler]:
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
                pass  # the client gave up: nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
