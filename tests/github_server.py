"""A fake GitHub REST API for the tests: the endpoints merlin calls, in memory, each call
recorded. Point ``GITHUB_API_URL`` (or ``GitHubApi``'s base URL) at ``FakeGitHub.url``.

It answers as GitHub does for what merlin reads (the fields PyGithub parses), refuses
what GitHub would (an unknown issue: 404; a write with a read-only token: 403), and
keeps every request in ``calls`` as ``(method, path, json body)``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = re.compile(r"^/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)(?P<rest>/.*)?$")
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "github"
"""GitHub's own example payloads (from octokit/webhooks), one per event and action."""


def event_payload(name: str, repository: str | None = None, **changes: Any) -> dict[str, Any]:
    """The fixture ``name`` (``issues.labeled``...) in ``repository``, with ``changes``:
    ``comment__body="x"`` sets ``payload["comment"]["body"]``."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    if repository is not None:
        data["repository"]["full_name"] = repository
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        target = data
        for key in path:
            target = target[key]
        target[last] = value
    return data


@dataclass
class FakeGitHub:
    """The state of one fake repository and everything asked of it."""

    repository: str = "acme/shop"
    login: str | None = "merlin-bot"
    """Who the token is (``GET /user``); None: an Actions token, which may not ask."""
    writable: bool = True
    default_branch: str = "main"
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_issue(self, number: int, title: str, body: str, labels: tuple[str, ...] = ()) -> None:
        self.issues[number] = {"number": number, "title": title, "body": body,
                               "labels": [{"name": name} for name in labels]}  # fmt: skip

    def add_comment(self, number: int, body: str, author: str) -> int:
        """A comment by ``author`` (someone else than the token) in thread ``number``."""
        with self._lock:
            comment_id = next(self._ids)
            self.comments[comment_id] = {"id": comment_id, "issue": number, "body": body,
                                         "author": author}  # fmt: skip
            return comment_id

    def thread(self, number: int) -> list[dict[str, Any]]:
        """The comments of issue or pull request ``number``, oldest first."""
        return [c for c in self.comments.values() if c["issue"] == number]

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status, JSON) for one request."""
        with self._lock:
            self.calls.append((method, path, body))
            if path == "/user":
                return (200, self._user(self.login)) if self.login else (403, _FORBIDDEN)
            match = REPO.match(path)
            if match is None or f"{match['owner']}/{match['name']}" != self.repository:
                return 404, _message("Not Found")
            if method != "GET" and not self.writable:
                return 403, _FORBIDDEN
            return self._repo(method, match["rest"] or "", body)

    def _repo(self, method: str, rest: str, body: Any) -> tuple[int, Any]:
        base = f"{self.url}/repos/{self.repository}"
        if rest == "" and method == "GET":
            return 200, {"full_name": self.repository, "default_branch": self.default_branch,
                         "url": base, "name": self.repository.split("/")[1]}  # fmt: skip
        if m := re.fullmatch(r"/issues/(\d+)/comments", rest):
            number = int(m[1])
            if number not in self.issues and number not in self.pulls:
                return 404, _message("Not Found")
            if method == "POST":
                comment_id = next(self._ids)
                made = {"id": comment_id, "issue": number, "body": body["body"]}
                self.comments[comment_id] = {**made, "author": self.login}
                return 201, self._comment(self.comments[comment_id])
            return 200, [self._comment(c) for c in self.thread(number)]
        if m := re.fullmatch(r"/issues/(?:\d+/)?comments/(\d+)", rest):
            comment = self.comments.get(int(m[1]))
            if comment is None:
                return 404, _message("Not Found")
            if method == "PATCH":
                comment["body"] = body["body"]
            return 200, self._comment(comment)
        if m := re.fullmatch(r"/issues/(\d+)", rest):
            issue = self.issues.get(int(m[1]))
            return (200, {**issue, "url": f"{base}/issues/{m[1]}"}) if issue else (404, None)
        if rest == "/pulls" and method == "POST":
            number = 1 + max([0, *self.issues, *self.pulls])
            self.pulls[number] = {"number": number, "title": body["title"],
                                  "body": body.get("body"), "draft": body.get("draft", False),
                                  "head": body["head"], "base": body["base"]}  # fmt: skip
            return 201, self._pull(number)
        if m := re.fullmatch(r"/pulls/(\d+)", rest):
            return (200, self._pull(int(m[1]))) if int(m[1]) in self.pulls else (404, None)
        return 404, _message(f"the fake has no {method} {rest}")

    def _user(self, login: str | None) -> dict[str, Any]:
        bot = login is None or login.endswith("[bot]")
        return {"login": login or "github-actions[bot]", "type": "Bot" if bot else "User"}

    def _comment(self, comment: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.url}/repos/{self.repository}/issues/comments/{comment['id']}"
        return {"id": comment["id"], "body": comment["body"], "url": url,
                "html_url": f"https://github.example/{self.repository}#c{comment['id']}",
                "user": self._user(comment["author"])}  # fmt: skip

    def _pull(self, number: int) -> dict[str, Any]:
        pull = self.pulls[number]
        head = pull["head"] if ":" in pull["head"] else f"{self.repository}:{pull['head']}"
        owner_repo, ref = head.rsplit(":", 1)
        if "/" not in owner_repo:  # "owner:branch" names a branch of owner's fork
            owner_repo = f"{owner_repo}/{self.repository.split('/')[1]}"
        return {"number": number, "title": pull["title"], "body": pull["body"],
                "draft": pull["draft"], "state": "open",
                "url": f"{self.url}/repos/{self.repository}/pulls/{number}",
                "html_url": f"https://github.example/{self.repository}/pull/{number}",
                "head": {"ref": ref, "repo": {"full_name": owner_repo}},
                "base": {"ref": pull["base"], "repo": {"full_name": self.repository}}}  # fmt: skip


def _message(text: str) -> dict[str, str]:
    return {"message": text}


_FORBIDDEN = _message("Resource not accessible by integration")
"""GitHub's answer to an installation token (``GITHUB_TOKEN``) that may not do that."""


@contextmanager
def fake_github(fake: FakeGitHub | None = None) -> Iterator[FakeGitHub]:
    """Serve ``fake`` on a free port of 127.0.0.1 for the ``with`` block."""
    fake = fake or FakeGitHub()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path = self.path.split("?", 1)[0]
            status, answer = fake.answer(self.command, path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
