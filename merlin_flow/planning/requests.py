"""What a request in plain words becomes, decided by rules before any model is called.

A request is one of three kinds:

- a **question**: it ends with ``?``, or it starts by asking (what, why, how, where,
  which, when, who, explain, describe, show me, tell me...). It is answered by a
  read-only job: no plan, no branch, no exit command. A polite action is not a
  question: after a leading "please", "can you", "could you" or "would you", a request
  that starts with an action verb ("Can you fix the login bug?") is an action.
- a **single action**: one short imperative on one thing. It starts with an action
  verb, has at most ``SINGLE_MAX_WORDS`` words on one line, names no broad scope ("all",
  "every", "across"..., as routing counts them), does not build a whole thing from
  nothing ("create a game", "build an API": a making verb and a system word, as in the
  planner seed's rules), and joins no second action ("and add", "then run", "; also").
  It becomes one step, with no planner call.
- everything else is **planned** by a model. A numbered list of three or more items
  (``1.``, ``1)`` or ``- [ ]`` lines count; bullets do not) gives the plan its skeleton:
  one step per item.

``@path`` words name files to attach to the planner's prompt (an e-mail address is not
one). The rules are tested on a table of requests in ``tests/unit/planning/test_requests.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from merlin_flow.planning.routing import BROAD_WORDS, Complexity
from merlin_flow.tasklist import StepType


class RequestKind(StrEnum):
    """How a request is handled."""

    QUESTION = "question"
    SINGLE = "single"
    PLANNED = "planned"


SINGLE_MAX_WORDS = 12
"""The longest single action, in words."""
LONG_REQUEST_CHARS = 250
"""A request longer than this is complex to plan."""
SKELETON_MIN_ITEMS = 3
"""A numbered list with this many items gives the plan its steps."""

QUESTION_START = re.compile(
    r"^(what|why|how|where|which|when|who|whose|explain|describe|show me|tell me|"
    r"is there|are there|is it|does|do i|do we|should i|should we|can i|"
    r"can you (explain|tell|describe|show)|could you (explain|tell|describe|show))\b",
    re.IGNORECASE,
)
POLITE = re.compile(r"^(please|pls|kindly|can you|could you|would you|will you)\b[\s,]*", re.I)
ACTION_VERBS = (
    "add", "fix", "remove", "delete", "rename", "update", "change", "replace", "refactor",
    "create", "build", "implement", "make", "write", "move", "extract", "bump", "upgrade",
    "format", "sort", "convert", "debug", "resolve", "correct", "document", "test",
    "clean", "simplify", "split", "merge", "drop", "set", "use", "raise", "return",
    "handle", "support", "improve", "optimize", "speed", "migrate", "port", "introduce",
    "generate", "configure", "enable", "disable", "deprecate", "inline", "reorder", "tidy",
)  # fmt: skip
ACTION_START = re.compile(rf"^({'|'.join(ACTION_VERBS)})\b", re.IGNORECASE)
SECOND_ACTION = re.compile(
    rf"(\b(and|also|plus)\s+({'|'.join(ACTION_VERBS)})\b|\bthen\b|;|\bas well as\b)",
    re.IGNORECASE,
)
NEW_SYSTEM = re.compile(
    r"^(create|build|implement|develop|design|make|write)\b.*\b(game|app|application|"
    r"system|service|website|site|api|server|dashboard|pipeline|framework|library|program|"
    r"project|backend|frontend|platform|integration)s?\b",
    re.IGNORECASE,
)
NUMBERED_ITEM = re.compile(r"^\s*(?:\d+[.)]|-\s*\[\s?\])\s+(?P<item>\S.*)$", re.MULTILINE)
FILE_REFERENCE = re.compile(r"(?:^|(?<=[\s(\"'`]))@(?P<path>[\w./-]*[\w/-])")
STEP_TYPE_WORDS: tuple[tuple[StepType, re.Pattern[str]], ...] = (
    (StepType.TEST, re.compile(r"\b(tests?|testing|coverage)\b", re.I)),
    (StepType.DEBUG, re.compile(r"\b(fix\w*|bugs?|debug\w*|crash\w*|errors?|fail\w*)\b", re.I)),
    (
        StepType.REFACTOR,
        re.compile(r"\b(refactor\w*|renam\w*|mov(e|ing)|extract\w*|clean\w*|tidy)\b", re.I),
    ),
    (StepType.VERIFY, re.compile(r"\b(verify|check|audit|lint)\b", re.I)),
)


@dataclass(frozen=True)
class Classification:
    """What a request is, why, and what the planner starts from."""

    kind: RequestKind
    reason: str
    complexity: Complexity
    skeleton: tuple[str, ...] = ()
    """The numbered items a plan must follow, one step each (may be empty)."""
    files: tuple[str, ...] = ()
    """The ``@path`` references, in order, each once."""


def classify(request: str) -> Classification:
    """The kind of ``request`` by the rules in the module docstring."""
    text = request.strip()
    files = file_references(text)
    items = numbered_items(text)
    if len(items) >= SKELETON_MIN_ITEMS:
        complexity = Complexity.COMPLEX if len(items) > 5 else Complexity.MEDIUM
        return Classification(
            RequestKind.PLANNED, f"a numbered list of {len(items)} items", complexity, items, files
        )
    action = POLITE.sub("", text)
    if not ACTION_START.match(action) and (text.endswith("?") or QUESTION_START.match(text)):
        return Classification(RequestKind.QUESTION, "it asks", Complexity.SIMPLE, files=files)
    words = len(text.split())
    if not ACTION_START.match(action):
        return _planned("it does not start with an action verb", text, files)
    if "\n" in text.strip():
        return _planned("it has several lines", text, files)
    if words > SINGLE_MAX_WORDS:
        return _planned(
            f"it has {words} words (a single action has {SINGLE_MAX_WORDS})", text, files
        )
    if second := SECOND_ACTION.search(action):
        return _planned(f"it joins a second action ({second.group(0).strip()!r})", text, files)
    if broad := BROAD_WORDS.search(action):
        return _planned(f"it names a broad scope ({broad.group(0)!r})", text, files)
    if built := NEW_SYSTEM.match(action):
        return _planned(f"it builds a whole {built.group(2).lower()}", text, files)
    return Classification(
        RequestKind.SINGLE, "one short imperative", Complexity.SIMPLE, files=files
    )


def _planned(reason: str, text: str, files: tuple[str, ...]) -> Classification:
    complexity = Complexity.COMPLEX if len(text) > LONG_REQUEST_CHARS else Complexity.MEDIUM
    return Classification(RequestKind.PLANNED, reason, complexity, files=files)


def numbered_items(text: str) -> tuple[str, ...]:
    """The items of the request's numbered list (``1.``, ``2)``, ``- [ ]``), in order."""
    return tuple(match.group("item").strip() for match in NUMBERED_ITEM.finditer(text))


def file_references(text: str) -> tuple[str, ...]:
    """The ``@path`` words of a request, each once, in order (not e-mail addresses)."""
    found = (match.group("path").rstrip(".") for match in FILE_REFERENCE.finditer(text))
    return tuple(dict.fromkeys(path for path in found if path))


def step_type_for(text: str) -> StepType:
    """The step type a text's words suggest: Test, Debug, Refactor, Verify, else Feature.

    The first that matches wins, in that order: "add tests for the parser bug" is Test.
    """
    for step_type, words in STEP_TYPE_WORDS:
        if words.search(text):
            return step_type
    return StepType.FEATURE
