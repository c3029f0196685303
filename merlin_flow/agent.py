"""The agent loop: a model with tools works on one step inside one worktree.

Each attempt is a new conversation: the system prompt, the step, and feedback from
earlier attempts as text. Every reply's tool calls are executed in order and answered;
the loop ends when the model replies without tool calls, or fails at the turn limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from merlin_flow.config import Tier
from merlin_flow.errors import AgentError
from merlin_flow.llm import Completion, complete
from merlin_flow.tools import TOOL_SCHEMAS, Toolbox

SYSTEM_PROMPT = """\
You are merlin, an autonomous coding agent working inside a git repository.
Use the tools to read and change files; your working directory is the repository root.
Make the smallest change that accomplishes the step. Do not ask questions: act.
When the step is done, reply with a short summary of what you changed and no tool calls.
Your work is checked afterwards by running the step's exit command; a failure sends the
step back to you or to a stronger model with the command's output.
"""


@dataclass(frozen=True)
class StepBrief:
    """What the agent is told about the step it works on."""

    step_id: str
    step_type: str
    description: str
    verification: str
    exit_command: str


def first_messages(brief: StepBrief, feedback: str | None) -> list[dict[str, Any]]:
    """The opening conversation of an attempt."""
    lines = [
        f"Step {brief.step_id} ({brief.step_type}): {brief.description}",
        f"Done when: {brief.verification}" if brief.verification else "",
        f"Exit command that must succeed: {brief.exit_command}",
    ]
    if feedback:
        lines += ["", "Earlier attempts at this step failed:", feedback]
    user = "\n".join(line for line in lines if line).strip()
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclass
class AgentResult:
    """How an attempt's conversation ended."""

    summary: str
    turns: int


CallHook = Callable[[int, Completion | None, BaseException | None], None]


def run_agent(
    tier: Tier,
    brief: StepBrief,
    toolbox: Toolbox,
    feedback: str | None,
    max_turns: int,
    on_call: CallHook,
    check_alive: Callable[[], None] = lambda: None,
) -> AgentResult:
    """Converse with ``tier``'s model until it stops calling tools.

    ``on_call(seq, completion, error)`` is told of every model call (the journal);
    ``check_alive()`` runs before each call and may raise to stop the attempt.
    Raises AgentError when the model fails or the turn limit is reached.
    """
    messages = first_messages(brief, feedback)
    for turn in range(max_turns):
        check_alive()
        try:
            reply = complete(tier, messages, TOOL_SCHEMAS)
        except Exception as exc:  # every model error is a failed attempt, never a crash
            on_call(turn, None, exc)
            raise AgentError(f"model call failed on tier {tier.name!r}: {_short(exc)}") from None
        on_call(turn, reply, None)
        messages.append(reply.message)
        if not reply.tool_calls:
            return AgentResult(summary=(reply.message.get("content") or "").strip(), turns=turn + 1)
        for call in reply.tool_calls:
            function = call.get("function", {})
            output = toolbox.call(function.get("name", ""), function.get("arguments") or "{}")
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": output})
    raise AgentError(f"turn limit reached: {max_turns} model replies without finishing")


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 500 else text[:500] + "..."


def describe_call(completion: Completion) -> str:
    """One line for logs: the tools a reply called, or that it answered."""
    names = [c.get("function", {}).get("name") for c in completion.tool_calls]
    return f"tools: {json.dumps(names)}" if names else "answered"
