"""What a GitHub event asks of merlin: a trigger to act on, a reply to give, or nothing.

``read_event`` reads the payload GitHub Actions saves for the event that started the
workflow (``GITHUB_EVENT_NAME``, ``GITHUB_EVENT_PATH``). It decides from the payload
alone; what needs the API (a comment's pull request and whether it comes from a fork,
whether the plan in the thread is merlin's own) is left to the caller.

- ``issues`` or ``pull_request`` labelled with the trigger label: plan the thread's
  title and body. Only people who may triage can label, so a label is trusted.
- ``issue_comment``, ``pull_request_review`` and ``pull_request_review_comment`` whose
  text starts with ``/merlin``: a command, obeyed from trusted associations only.
- Bots, other labels, other actions and comments that are not commands: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from merlin_flow.errors import InputError

PREFIX = "/merlin"
EVENTS = (
    "issues",
    "issue_comment",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
)
"""The event names ``merlin github`` handles; a workflow must trigger on no other."""
TRUSTED = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
"""Author associations obeyed by default."""


class Command(StrEnum):
    """What a ``/merlin`` comment (or the label) asks for."""

    PLAN = "plan"
    APPROVE = "approve"
    REJECT = "reject"
    RETRY = "retry"
    CANCEL = "cancel"
    REQUEST = "request"
    """``/merlin <request>``: plan it on an issue, run it on a pull request's branch."""


WORDS = tuple(c.value for c in Command if c is not Command.REQUEST)


@dataclass(frozen=True)
class Thread:
    """The issue or pull request an event happened in."""

    repository: str
    number: int
    title: str
    body: str
    is_pull_request: bool
    labels: tuple[str, ...] = ()
    head_ref: str | None = None
    """A pull request's branch, when the payload has it (not on ``issue_comment``)."""
    head_repository: str | None = None
    """The repository that branch lives in: another one for a fork."""

    @property
    def from_fork(self) -> bool:
        """True when the payload says the pull request's branch is in another repository."""
        return self.head_repository is not None and self.head_repository != self.repository


@dataclass(frozen=True)
class Trigger:
    """Something to do, asked by ``author`` in ``thread``."""

    command: Command
    thread: Thread
    author: str
    text: str = ""
    """The request of a ``/merlin <request>`` comment (without the prefix)."""
    comment_id: int | None = None
    path: str | None = None
    """The file a review comment is attached to, and its lines."""
    lines: tuple[int, int] | None = None


@dataclass(frozen=True)
class Reply:
    """Not obeyed: say why in the thread (``exit_code`` 2 when the input was bad)."""

    thread: Thread
    text: str
    exit_code: int = 0


@dataclass(frozen=True)
class Ignore:
    """Nothing to do; ``reason`` goes to the workflow's log."""

    reason: str


Outcome = Trigger | Reply | Ignore


@dataclass(frozen=True)
class Options:
    """What the team chose: the trigger label and whose commands are obeyed."""

    label: str = "merlin"
    trusted: frozenset[str] = field(default=TRUSTED)


def read_event(name: str, payload: dict[str, Any], options: Options | None = None) -> Outcome:
    """The outcome of event ``name``; InputError for an event merlin does not handle."""
    options = options or Options()
    if name not in EVENTS:
        raise InputError(
            f"merlin github handles {', '.join(EVENTS)} events, not {name!r}: "
            "trigger the workflow on those only"
        )
    try:
        if _is_bot(payload.get("sender")):
            return Ignore(f"{_login(payload.get('sender'))} is a bot")
        if name in ("issues", "pull_request"):
            return _labelled(name, payload, options)
        return _commented(name, payload, options)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"the {name} event payload is not one GitHub sends: {exc!r}") from None


def _labelled(name: str, payload: dict[str, Any], options: Options) -> Outcome:
    if payload.get("action") != "labeled":
        return Ignore(f"{name} {payload.get('action')}: only a label starts merlin")
    label = payload["label"]["name"]
    if label != options.label:
        return Ignore(f"label {label!r} is not {options.label!r}")
    thread = _thread(name, payload)
    if thread.from_fork:
        return fork_refusal(thread)
    if not (thread.title.strip() or thread.body.strip()):
        return Reply(thread, "This has no title or description: say what to do.", 2)
    if not thread.body.strip():
        return Reply(
            thread,
            f"This {_kind(thread)} has no description, so there is nothing to plan but "
            f"its title. Say what to do in the description, then label it "
            f"`{options.label}` again.",
            2,
        )
    return Trigger(Command.PLAN, thread, _login(payload.get("sender")))


def _commented(name: str, payload: dict[str, Any], options: Options) -> Outcome:
    item = payload["review"] if name == "pull_request_review" else payload["comment"]
    wanted = "submitted" if name == "pull_request_review" else "created"
    if payload.get("action") != wanted:
        return Ignore(f"{name} {payload.get('action')}: only new comments are read")
    if _is_bot(item.get("user")):
        return Ignore(f"{_login(item.get('user'))} is a bot")
    body = (item.get("body") or "").strip()
    first, _, rest = body.partition("\n")
    if first.split(" ", 1)[0].lower() != PREFIX:
        return Ignore("the comment is not a /merlin command")
    thread = _thread(name, payload)
    author = _login(item.get("user"))
    association = str(item.get("author_association") or "NONE")
    if association not in options.trusted:
        return Reply(
            thread,
            f"Thanks @{author}. merlin takes commands only from this repository's "
            f"{_listed(options.trusted)}; ask one of them to run it.",
        )
    if thread.from_fork:
        return fork_refusal(thread)
    words = first[len(PREFIX) :].strip()
    text = "\n".join(part for part in (words, rest.strip()) if part)
    command = _command(words) if words else (Command.REQUEST if rest.strip() else None)
    if command is None:
        return Reply(thread, _usage(f"`{first}` is not a command merlin knows."), 2)
    line, start = item.get("line") or item.get("original_line"), item.get("start_line")
    return Trigger(
        command,
        thread,
        author,
        text=text if command is Command.REQUEST else "",
        comment_id=int(item["id"]),
        path=item.get("path"),
        lines=(int(start or line), int(line)) if line else None,
    )


def fork_refusal(thread: Thread) -> Reply:
    """The answer to a command on a pull request from a fork: merlin does not run there."""
    return Reply(
        thread,
        f"merlin does not work on pull requests from forks ({thread.head_repository}): "
        "the workflow's secrets are not given to them, and their code is not trusted "
        "with the model keys. A maintainer can push the branch here and ask again.",
    )


def _command(words: str) -> Command | None:
    """The command ``words`` name; None for one word that is no command (a typo)."""
    if words.lower() in WORDS:
        return Command(words.lower())
    return None if " " not in words else Command.REQUEST


def _usage(problem: str) -> str:
    return (
        f"{problem} Commands: `/merlin plan`, `/merlin approve`, `/merlin reject`, "
        "`/merlin retry`, `/merlin cancel`, or `/merlin <what to do>`."
    )


def _thread(name: str, payload: dict[str, Any]) -> Thread:
    is_pr = name.startswith("pull_request")
    item = payload["pull_request"] if is_pr else payload["issue"]
    head = item.get("head") if is_pr else None
    return Thread(
        repository=str(payload["repository"]["full_name"]),
        number=int(item["number"]),
        title=str(item.get("title") or ""),
        body=str(item.get("body") or ""),
        is_pull_request=is_pr or "pull_request" in item,
        labels=tuple(str(label["name"]) for label in item.get("labels") or []),
        head_ref=str(head["ref"]) if head else None,
        head_repository=str((head.get("repo") or {}).get("full_name") or "?") if head else None,
    )


def _kind(thread: Thread) -> str:
    return "pull request" if thread.is_pull_request else "issue"


def _login(user: Any) -> str:
    return str(user.get("login")) if isinstance(user, dict) else "someone"


def _is_bot(user: Any) -> bool:
    return isinstance(user, dict) and (
        user.get("type") == "Bot" or str(user.get("login", "")).endswith("[bot]")
    )


def _listed(associations: frozenset[str]) -> str:
    names = sorted(a.lower() + "s" for a in associations)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
