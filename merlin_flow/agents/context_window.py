"""One conversation's context budget: its window, bounded tool answers, condensation.

``AttemptContext`` puts together, for one conversation with one tier, what keeps every
request within the model's window (docs/context.md):

- the window and the calibrated token counter (``merlin_flow.models.window``);
- the bound on each tool answer, ``read_output`` and the ``todo`` list
  (``merlin_flow.tools.observations``), added to the toolbox;
- the condenser (``merlin_flow.agents.condense``), whose summary call goes through the
  attempt's own model call, so it is journaled, paid for and replayed like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from merlin_flow.agents.condense import Condensation, Condenser, changes_so_far, mask_arguments
from merlin_flow.config import Tier
from merlin_flow.errors import BudgetExceeded
from merlin_flow.models.llm import Completion, ModelCall
from merlin_flow.models.scripted import replies_condensed
from merlin_flow.models.window import PromptCounter, context_window
from merlin_flow.settings import get_settings
from merlin_flow.tools.observations import (
    REPO_MAP,
    REPO_MAP_SCHEMA,
    Observations,
    TodoList,
    observation_tool,
)
from merlin_flow.tools.toolbox import Toolbox
from merlin_flow.workspace.repo_map import build_map, map_around

log = logging.getLogger(__name__)

CallHook = Callable[[int, Completion | None, BaseException | None], None]
PINNED_HEADING = "Kept for you whatever is condensed:"
MAP_HEADING = (
    "The repository's map (the files that matter to this step, best first, with their "
    "main definitions; the repo_map tool shows more around a file or a name):"
)
MAP_CEILING = 4096
"""The first prompt's map takes an eighth of the window, at most this many tokens."""
MAP_MIN_FILES = 25
"""A repository of no more source files than this gets no map in the first prompt: the
agent's first `list_files` shows all of it, for fewer tokens than a map of it."""
READ_HEADER = 200
"""Room a read's header line takes (a window of a file fits one observation with it)."""
REPLY_SHARE = 0.1
"""Largest share of the window (at 4 characters a token) a reply's text keeps."""
REPLY_ROOM_SHARE = 0.25
"""Largest share of the window a request asks for its reply (``max_tokens``): a tier's
4,096 by default would leave a 4,096-token local model no room for the request."""


def map_cache() -> Path:
    """Where repository maps are cached (``$MERLIN_HOME/repo_map``)."""
    return get_settings().home_dir / "repo_map"


def step_map(description: str, tier: Tier, toolbox: Toolbox) -> str:
    """The repository map for a step's first prompt, ranked towards its description.

    Within an eighth of the window (at most 4,096 tokens; aider gives its own 1,024), of
    the files the agent may read. "" for a repository of ``MAP_MIN_FILES`` source files
    or fewer, and when it cannot be made (it is help, never a need).
    """
    budget = min(MAP_CEILING, context_window(tier) // 8)
    counter = PromptCounter(tier)
    readable = toolbox.readable or (lambda _path: True)
    try:
        built = build_map(
            toolbox.root, budget_tokens=budget, focus_words=[description],
            cache_dir=map_cache(), count=counter.text, include=readable,
            min_files=MAP_MIN_FILES,
        )  # fmt: skip
    except Exception:  # a git or parser failure leaves the map out
        log.warning("repository map of %s failed", toolbox.root, exc_info=True)
        return ""
    return built.text if len(built.files) > MAP_MIN_FILES else ""


class AttemptContext:
    """The context budget of one conversation (see the module doc)."""

    def __init__(
        self,
        tier: Tier,
        toolbox: Toolbox,
        call_model: ModelCall,
        on_call: CallHook,
        on_condense: Callable[[Condensation], None] = lambda _c: None,
    ) -> None:
        self.window = context_window(tier)
        room = min(tier.max_tokens, int(self.window * REPLY_ROOM_SHARE))
        self.tier = tier.model_copy(update={"max_tokens": room})
        """The tier as this conversation asks it: its reply's room capped to the window."""
        self.toolbox = toolbox
        self.counter = PromptCounter(tier)
        self.observations = Observations(self.window, self.counter.text)
        self.todo = TodoList()
        toolbox.add([*self.observations.tools, *self.todo.tools, self._map_tool()])
        toolbox.read_chars = min(toolbox.read_chars, self.observations.chars - READ_HEADER)
        self.schemas = toolbox.schemas
        self._call_model, self._on_call, self._on_condense = call_model, on_call, on_condense
        self._turn = 0
        self._estimate = 0
        self.condenser = Condenser(
            self.window,
            self.tier.max_tokens,
            lambda messages: self.counter(messages, self.schemas),
            self.counter.text,
            self.pinned,
            self._summarise,
        )
        self.condensations: list[Condensation] = []
        self._history: list[dict[str, Any]] = []
        self._seen = 0

    def before_request(self, messages: list[dict[str, Any]], turn: int) -> None:
        """Condense ``messages`` if the request would pass the limit; note its estimate."""
        self._turn = turn
        self._fit(messages, force=False)
        self._estimate = self.counter.last_estimate

    def record(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The whole conversation so far, as ``merlin logs`` shows it.

        Every message as first sent, condensed or not, and each condensation's note where
        it happened.
        """
        self._history += messages[self._seen :]
        self._seen = len(messages)
        return list(self._history)

    def overflowed(self, messages: list[dict[str, Any]]) -> None:
        """The provider refused the request as too long: count higher and condense.

        The first prompt's repository map goes first: it is help, never a need.
        """
        self.counter.overflowed()
        for index, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, str):
                kept = content.split(f"\n{MAP_HEADING}", 1)[0]
                messages[index] = {**message, "content": kept}
                break  # the brief: the first user message
        self._fit(messages, force=True)
        self._estimate = self.counter.last_estimate

    def after_reply(self, reply: Completion) -> None:
        """Compare the request's estimate with the tokens the provider reported."""
        if not reply.replayed and not reply.cached:
            self.counter.observe(self._estimate, reply.prompt_tokens)

    def kept_reply(self, message: dict[str, Any], longest: int) -> dict[str, Any]:
        """A reply as the conversation keeps it: its text cut to ``REPLY_SHARE``.

        Unless ``longest`` (the loop's own cut) is shorter. A model's text is no
        observation, but a rambling one fills a window too.
        """
        content = message.get("content")
        most = int(self.window * REPLY_SHARE) * 4
        if not isinstance(content, str) or len(content) <= most or most >= longest:
            return message  # within the window's share, or the loop's own cut is shorter
        cut = f"{content[:most]}\n[cut by merlin: {len(content)} characters in all]"
        return {**message, "content": cut}

    def settle(self, messages: list[dict[str, Any]]) -> None:
        """Once its calls ran, mask the latest reply's arguments longer than an answer.

        A written file's content, say: it is on disk now, and read back if needed.
        """
        replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if replies:
            mask_arguments(messages, replies[-1], self.observations.chars)

    def bound(self, output: str, tool: str) -> str:
        """A tool's answer as the conversation keeps it."""
        return self.observations.bound(output, tool)

    def pinned(self) -> str:
        """What every condensed prompt carries, read fresh (todo list, changes so far)."""
        todo = self.todo.render() or "(empty: the todo tool keeps your plan)"
        changes = changes_so_far(self.toolbox.root)
        return f"{PINNED_HEADING}\nYour todo list:\n{todo}\n\nYour changes so far:\n{changes}"

    def _map_tool(self) -> Any:
        """The ``repo_map`` tool: the map around a file or a name, within one answer."""
        budget = min(self.observations.tokens, self.observations.chars // 4) - 20
        root, readable = self.toolbox.root, self.toolbox.readable or (lambda _path: True)

        def around(arguments: dict[str, Any]) -> str:
            target = arguments.get("target")
            if not isinstance(target, str) or not target.strip():
                return "error: target must be a file's path or a name"
            found = map_around(root, target, budget, map_cache(), self.counter.text,
                               include=readable)  # fmt: skip
            return found or "error: the map does not fit one answer here"

        return observation_tool(REPO_MAP, REPO_MAP_SCHEMA, around)

    def _fit(self, messages: list[dict[str, Any]], force: bool) -> None:
        self.record(messages)
        done = self.condenser.fit(messages, force)
        if done is not None:
            # The conversation was rewritten: from here on, only what is new is recorded.
            self._history += [m for m in messages if replies_condensed(m)][-1:]
            self._seen = len(messages)
            self.condensations.append(done)
            self.toolbox.forget_reads()  # a masked read must not be answered "unchanged"
            self._on_condense(done)

    def _summarise(self, request: list[dict[str, Any]], reply_tokens: int) -> str | None:
        tier = self.tier.model_copy(update={"max_tokens": min(self.tier.max_tokens, reply_tokens)})
        try:
            reply = self._call_model(tier, request, [])
        except BudgetExceeded:
            raise
        except Exception as exc:  # a failed summary drops the middle instead: expected input
            self._on_call(self._turn, None, exc)
            return None
        self._on_call(self._turn, reply, None)
        content = reply.message.get("content") if isinstance(reply.message, dict) else None
        return content[: reply_tokens * 4] if isinstance(content, str) else None
