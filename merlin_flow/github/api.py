"""The few GitHub REST calls the loop makes, through PyGithub, at any base URL.

GitHub Enterprise and the tests' fake (``tests/github_server.py``) need the base URL
(``GITHUB_API_URL`` in Actions). Objects are lazy: a call is made only when its answer
is needed, and writes are not spaced out (the loop edits one comment a few times a
minute). Any failure of the API is a ``GitHubError`` naming the call and GitHub's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from merlin_flow.errors import GitHubError

if TYPE_CHECKING:
    from github.Repository import Repository

T = TypeVar("T")
ACTIONS_BOT = "github-actions[bot]"
"""Who ``GITHUB_TOKEN`` comments as; it may not ask ``GET /user`` who it is."""


@dataclass(frozen=True)
class Comment:
    """One comment of an issue or pull request's conversation."""

    id: int
    author: str
    body: str


@dataclass(frozen=True)
class Pull:
    """What the loop needs of a pull request."""

    number: int
    url: str
    head_ref: str
    head_repository: str
    base_ref: str


class GitHubApi:
    """The repository ``repository`` (``owner/name``) as ``token`` sees it."""

    def __init__(self, repository: str, token: str, base_url: str) -> None:
        from github import Auth, Github

        self.repository = repository
        self._github = Github(
            auth=Auth.Token(token),
            base_url=base_url.rstrip("/"),
            lazy=True,
            seconds_between_requests=None,
            seconds_between_writes=None,
            retry=2,
            timeout=30,
        )
        self._repo = self._github.get_repo(repository)
        self._identity: str | None = None

    def identity(self) -> str:
        """The login merlin's comments are written by (asked once)."""
        from github import GithubException

        if self._identity is None:
            try:
                self._identity = str(self._github.get_user().login)
            except GithubException as exc:
                if exc.status not in (401, 403):  # an Actions token may not ask /user
                    raise _failed("GET /user", exc) from None
                self._identity = ACTIONS_BOT
        return self._identity

    def own_comments(self, number: int) -> list[Comment]:
        """The thread's comments written by merlin's identity, oldest first.

        Everything merlin reads back from a thread (its plan, its progress marks, what
        it said) is read from these only: anyone may write the same text.
        """
        me = self.identity()
        return [comment for comment in self.comments(number) if comment.author == me]

    def comments(self, number: int) -> list[Comment]:
        """The thread's comments, oldest first."""
        issue = self._repo.get_issue(number)
        return self._call(
            f"list the comments of #{number}",
            lambda: [Comment(c.id, c.user.login, c.body or "") for c in issue.get_comments()],
        )

    def post(self, number: int, body: str) -> Comment:
        """Add a comment to the thread."""
        issue = self._repo.get_issue(number)
        made = self._call(f"comment on #{number}", lambda: issue.create_comment(body))
        return Comment(made.id, made.user.login, made.body or "")

    def post_if_allowed(self, number: int, body: str) -> Comment | None:
        """``post``, or None when GitHub answers 403 (the token may not comment).

        GitHub gives the workflow of a fork's pull request events a read-only token.
        """
        from github import GithubException, RateLimitExceededException

        issue = self._repo.get_issue(number)
        try:
            made = issue.create_comment(body)
        except GithubException as exc:
            if exc.status == 403 and not isinstance(exc, RateLimitExceededException):
                return None
            raise _failed(f"comment on #{number}", exc) from None
        return Comment(made.id, made.user.login, made.body or "")

    def edit(self, number: int, comment_id: int, body: str) -> None:
        """Replace the text of one of the thread's comments."""
        comment = self._repo.get_issue(number).get_comment(comment_id)
        self._call(f"edit comment {comment_id}", lambda: comment.edit(body))

    def pull(self, number: int) -> Pull:
        """The pull request ``number``: its branch and where that branch lives."""
        return self._call(f"read pull request #{number}", lambda: _pull(self._repo, number))

    def open_draft(self, title: str, body: str, head: str, base: str) -> Pull:
        """Open a draft pull request of ``head`` into ``base``."""
        made = self._call(
            f"open a pull request of {head} into {base}",
            lambda: self._repo.create_pull(base, head, title=title, body=body, draft=True),
        )
        return _pull(self._repo, made.number)

    def default_branch(self) -> str:
        """The repository's default branch."""
        return self._call("read the repository", lambda: str(self._repo.default_branch))

    def _call(self, what: str, call: Callable[[], T]) -> T:
        from github import GithubException

        try:
            return call()
        except GithubException as exc:
            raise _failed(what, exc) from None


def _pull(repo: Repository, number: int) -> Pull:
    pull = repo.get_pull(number)
    head_repo = pull.head.repo
    return Pull(
        number=int(pull.number),
        url=str(pull.html_url),
        head_ref=str(pull.head.ref),
        head_repository=str(head_repo.full_name) if head_repo is not None else "?",
        base_ref=str(pull.base.ref),
    )


def _failed(what: str, exc: Exception) -> GitHubError:
    status = getattr(exc, "status", "?")
    data = getattr(exc, "data", None)
    message = data.get("message") if isinstance(data, dict) else None
    return GitHubError(f"GitHub refused to {what}: HTTP {status} {message or exc}")
