"""Condensation: keep an attempt's conversation within its model's window, plan included.

Before each request the conversation is counted (``merlin_flow.models.window``). Past
``TRIGGER`` of the window (or ``window - max_tokens``, when the reply's room is less),
it is condensed, in two stages, each only if the one before was not enough:

1. **Masking.** Tool answers older than the last ``KEEP_WHOLE`` are replaced by a one-line
   note (which tool, how long, "call it again if you need it"), and so are the long
   arguments of old calls (a ``write_file``'s content). "The Complexity Trap" found this
   halves cost with no loss of solve rate; SWE-agent keeps 5 whole, that paper 10.
2. **Summary.** The middle of the conversation (after the step's brief, before the last
   ``TAIL_SHARE`` of the window) is summarised by one call to the same model, whose
   prompt is cut to fit ``SUMMARY_SHARE`` of the window, so condensing can never be too
   long to condense. A failed summary call (an error is expected input) drops the middle
   instead, saying so.

After a summary the prompt is rebuilt: the system prompt and the step's brief (its
description, exit command and the last failing verification, from the store), the
summary, then **what must never be lost**, read fresh rather than from the summary: the
agent's todo list (``merlin_flow.tools.observations.TodoList``) and the attempt's changes
so far (``git status`` and ``git diff --stat`` of the worktree). Then the latest messages.
A conversation is condensed to ``TARGET`` of the window, so that it is not condensed
again at the next turn.

A provider's context-length refusal (our count was low) triggers one forced
condensation and a retry (``merlin_flow.agents.loop``), never an escalation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merlin_flow.models.scripted import CONDENSED_NOTE, replies_condensed
from merlin_flow.workspace.git import run_git

TRIGGER = 0.75
"""Share of the window past which a request is condensed first."""
TARGET = 0.5
"""Share of the window a condensation brings the request under."""
KEEP_WHOLE = 10
"""Tool answers kept whole when older ones are masked (the newest ones)."""
TAIL_SHARE = 0.2
"""Share of the window the latest messages may keep after a summary."""
SUMMARY_SHARE = 0.5
"""Largest share of the window the summary request takes (reply included)."""
SUMMARY_REPLY_SHARE = 0.08
"""Largest share of the window the summary itself takes."""
MASK_ARGUMENTS_OVER = 400
"""Old calls' arguments longer than this (characters) are masked with old answers."""
MASKED = (
    "[merlin: this {what} ({chars} characters) was hidden to keep the context small; "
    "call the tool again if you need it]"
)
SUMMARY_PROMPT = """\
You condense the work log of a coding agent so that it can go on with its step.
Write a short summary: what it found (files, functions, causes), what it changed, what it
tried that failed and why, and what it meant to do next. Quote exact file paths and
names. Do not invent anything. Plain text, at most {words} words.
"""
MAX_STATUS_LINES = 40

Count = Callable[[list[dict[str, Any]]], int]
CountText = Callable[[str], int]
Summarise = Callable[[list[dict[str, Any]], int], str | None]
"""Called with the summary request's messages and the reply's token limit; None: failed."""


@dataclass(frozen=True)
class Condensation:
    """What one condensation did (journaled as a ``context_condensed`` event)."""

    how: str
    """"masked", "summarised" or "dropped" (the summary call failed)."""
    before: int
    after: int
    """Tokens of the request before and after, by the counter."""
    masked: int
    """Tool answers (and call arguments) masked."""
    condensed: int
    """Messages replaced by the summary (0 when masking was enough)."""
    forced: bool
    """After the provider refused a request as too long."""

    def describe(self) -> str:
        """One line for people: ``merlin logs`` and the events."""
        why = " after the provider refused a request as too long" if self.forced else ""
        return (
            f"context {self.how}{why}: {self.before} -> {self.after} tokens "
            f"({self.masked} outputs masked, {self.condensed} messages summarised)"
        )


def limit(window: int, max_tokens: int) -> int:
    """Tokens past which a request is condensed."""
    return max(int(window * 0.25), min(int(window * TRIGGER), window - max_tokens))


def changes_so_far(worktree: Path) -> str:
    """``git status`` and ``git diff --stat`` of the worktree, for the pinned facts."""
    try:
        status = run_git(["status", "--porcelain", "--untracked-files=all"], worktree, timeout=30)
        stat = run_git(["diff", "--stat", "HEAD"], worktree, timeout=30)
    except Exception as exc:  # a damaged worktree must not end the attempt here
        return f"(git could not tell: {exc})"
    lines = status.stdout.splitlines()
    shown = lines[:MAX_STATUS_LINES] + (
        [f"... and {len(lines) - MAX_STATUS_LINES} more"] if len(lines) > MAX_STATUS_LINES else []
    )
    summary = stat.stdout.strip().splitlines()[-1:] if stat.returncode == 0 else []
    return "\n".join(shown + summary) or "(no changes yet)"


class Condenser:
    """Fits one attempt's conversation to its window (see the module doc)."""

    def __init__(
        self,
        window: int,
        max_tokens: int,
        count: Count,
        count_text: CountText,
        pinned: Callable[[], str],
        summarise: Summarise | None,
    ) -> None:
        """``count`` counts a request (tool schemas included), ``count_text`` a text."""
        self.window = window
        self.limit = limit(window, max_tokens)
        self.target = min(self.limit, int(window * TARGET))
        self.count = count
        self.count_text = count_text
        self.pinned = pinned
        self.summarise = summarise

    def fit(self, messages: list[dict[str, Any]], force: bool = False) -> Condensation | None:
        """Condense ``messages`` in place when over the limit (or ``force``); what it did."""
        before = self.count(messages)
        if before <= self.limit and not force:
            return None
        masked = mask(messages, KEEP_WHOLE)
        after = self.count(messages)
        if after <= self.target:
            return Condensation("masked", before, after, masked, 0, force)
        head, middle, tail = self._split(messages)
        if not middle or (not force and self._note_tokens() >= self._tokens_of(middle)):
            # Nothing between the brief and the latest messages, or less than the note
            # that would stand for it (the brief itself is most of the request): no call.
            done = Condensation("masked", before, after, masked, 0, force)
            return done if masked or force else None
        summary = self._summary(middle)
        how = "summarised" if summary is not None else "dropped"
        if summary is None:
            summary = f"{len(middle)} earlier messages were dropped; what they changed is below."
        replies = sum(1 if m.get("role") == "assistant" else replies_condensed(m) for m in middle)
        opening = CONDENSED_NOTE.format(replies=replies)
        note = f"{opening}\n\nSummary of the work so far:\n{summary}\n\n{self.pinned()}"
        messages[:] = [*head, {"role": "user", "content": note}, *tail]
        while self.count(messages) > self.target and len(messages) > len(head) + 1:
            masked += mask(messages, 1)  # the tail alone is too long: keep its last answer
            if self.count(messages) <= self.target:
                break
            _drop_first_group(messages, len(head) + 1)
        return Condensation(how, before, self.count(messages), masked, len(middle), force)

    def _tokens_of(self, middle: list[dict[str, Any]]) -> int:
        return self.count_text("\n\n".join(_as_text(m) for m in middle))

    def _note_tokens(self) -> int:
        """What a condensation's note costs at most: opening, summary and pinned facts."""
        reply_tokens = max(128, int(self.window * SUMMARY_REPLY_SHARE))
        return self.count_text(f"{CONDENSED_NOTE}\n{self.pinned()}") + reply_tokens

    def _split(
        self, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """The pinned head (system, brief), the middle to summarise, the latest messages."""
        first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0) + 1
        start, left = len(messages), int(self.window * TAIL_SHARE)
        while start > first:
            left -= self.count([messages[start - 1]])
            if left < 0:
                break
            start -= 1
        while start < len(messages) and messages[start].get("role") == "tool":
            start += 1  # a tool answer never opens the tail: its call would be gone
        return messages[:first], messages[first:start], messages[start:]

    def _summary(self, middle: list[dict[str, Any]]) -> str | None:
        if self.summarise is None:
            return None
        reply_tokens = max(128, int(self.window * SUMMARY_REPLY_SHARE))
        system = SUMMARY_PROMPT.format(words=int(reply_tokens * 0.6))
        room = int(self.window * SUMMARY_SHARE) - reply_tokens
        entries = [_as_text(m) for m in middle]
        earlier = entries.pop(0) if replies_condensed(middle[0]) else ""
        left = room - self.count_text(system) - 50 - self.count_text(earlier[:8000])
        kept: list[str] = []
        for entry in reversed(entries):  # the newest first; an earlier summary always
            left -= self.count_text(entry) + 2
            if left < 0:
                break
            kept.append(entry)
        dropped = len(entries) - len(kept)
        log = "\n\n".join(
            [earlier[:8000]] * bool(earlier)
            + [f"[{dropped} older entries left out]"] * bool(dropped)
            + kept[::-1]
        )
        request = [{"role": "system", "content": system}, {"role": "user", "content": log}]
        text = self.summarise(request, reply_tokens)
        return text.strip() if text and text.strip() else None


def mask(messages: list[dict[str, Any]], keep: int) -> int:
    """Mask tool answers and long call arguments older than the last ``keep`` answers."""
    answers = [i for i, m in enumerate(messages) if m.get("role") == "tool"]
    older = set(answers[: max(0, len(answers) - keep)])
    first_kept = min(set(answers) - older, default=len(messages))
    names = _call_names(messages)
    masked = 0
    for index, message in enumerate(messages):
        if index in older:
            content = str(message.get("content") or "")
            tool = names.get(message.get("tool_call_id"), "a tool")
            note = MASKED.format(what=f"output of {tool}", chars=len(content))
            if len(content) > len(note):
                messages[index] = {**message, "content": note}
                masked += 1
        elif message.get("role") == "assistant" and index < first_kept:
            masked += mask_arguments(messages, index, MASK_ARGUMENTS_OVER)
    return masked


def mask_arguments(messages: list[dict[str, Any]], index: int, longest: int) -> int:
    """Mask the arguments longer than ``longest`` of the reply at ``index``; how many."""
    calls = messages[index].get("tool_calls")
    if not isinstance(calls, list):
        return 0
    kept, changed = [], 0
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(function, dict) and isinstance(arguments, str) and len(arguments) > longest:
            note = MASKED.format(what="call's arguments", chars=len(arguments))
            call = {**call, "function": {**function, "arguments": json.dumps({"merlin": note})}}
            changed += 1
        kept.append(call)
    if changed:
        messages[index] = {**messages[index], "tool_calls": kept}
    return changed


def _call_names(messages: Sequence[dict[str, Any]]) -> dict[Any, str]:
    names = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                names[call.get("id")] = str(function.get("name", "a tool"))
    return names


def _drop_first_group(messages: list[dict[str, Any]], start: int) -> None:
    """Remove the message at ``start`` and the tool answers that follow it."""
    del messages[start]
    while start < len(messages) and messages[start].get("role") == "tool":
        del messages[start]


def _as_text(message: dict[str, Any]) -> str:
    """One message as a line of the summary's work log."""
    text = str(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += f"\ncalls {function.get('name')}({str(function.get('arguments'))[:500]})"
    if len(text) > 4000:
        text = text[:2000] + " [...] " + text[-1500:]
    return f"{message.get('role', '?')}: {text.strip()}"
