"""The agent loop: a model with tools works on one step inside one worktree.

Each attempt is a new conversation: the system prompt (with the step's agent's own
prompt and the repository's instructions, when there are), the step, and feedback from
earlier attempts as text. Every reply's tool calls are executed in order and answered;
a reply without any is searched for calls written as text (``merlin_flow.tools.text_calls``),
which are then run as if the model had made them. The loop ends when the model calls
``finish`` (its summary is the attempt's), when it replies with no call at all (its text
is the summary), or fails at the turn limit.

What a hostile model sends is bounded before it stays in the conversation (and is sent
again with every later request): a reply's text, each call's arguments and each tool's
answer longer than ``MAX_KEPT_CHARS`` are cut, and marked so; a reply's calls past
``MAX_CALLS_PER_REPLY`` are answered as not run. The tools see the arguments whole (they
refuse what is too large: ``merlin_flow.tools.toolbox``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from merlin_flow.agents.condense import Condensation
from merlin_flow.agents.context_window import MAP_HEADING, AttemptContext
from merlin_flow.config import Limits, Tier
from merlin_flow.errors import AgentError, BudgetExceeded, ModelUnreachable
from merlin_flow.failures import Action, Failure, FailureKind, decide
from merlin_flow.models.diagnosis import CONTEXT_EXCEEDED, ModelFailure, examine, retry_after
from merlin_flow.models.endpoints import describe
from merlin_flow.models.llm import Completion, ModelCall, complete
from merlin_flow.tools.text_calls import text_tool_calls
from merlin_flow.tools.toolbox import FINISH, FINISHED, Toolbox, parse_arguments

TRANSCRIPT_CHARS = 8000
"""Longest message text a stored transcript keeps (``for_the_record``)."""
MODEL_UNREACHABLE = "model unreachable: "
"""How the error of an attempt that could not use its model starts. It is for people:
the engine stores the failure's kind apart (``Attempt.failure_kind``)."""

SYSTEM_PROMPT = """\
You are merlin, an autonomous coding agent working on a project's files.
Use the tools to read and change files; your working directory is the project's root.
Commands run in a sandbox with the project's environment, without network or git:
merlin commits your changes when you finish. It commits files, never a git repository
made inside the project (a folder's .git is removed first): make scratch ones in /tmp.
Make the smallest change that accomplishes the step. Do not ask questions: act.
When the step is done, call finish with a short summary of what you changed.
Your work is checked afterwards by running the step's exit command; a failure sends the
step back to you or to a stronger model with the command's output.
"""


@dataclass(frozen=True)
class StepBrief:
    """What the agent is told about the step it works on."""

    step_key: str
    step_type: str
    description: str
    verification: str
    exit_command: str
    constraints: str = ""
    """The relevant specs' constraint sections (``spec_check.with_spec_constraints``)."""
    role_prompt: str = ""
    """The step's agent's own system prompt (from its agent file); empty: none."""
    instructions: str = ""
    """The repository's instructions to coding agents (its AGENTS.md); empty: none."""
    instructions_file: str = ""
    """The file ``instructions`` came from, as the prompt names it (default AGENTS.md)."""
    repo_map: str = ""
    """The repository map ranked towards the step (``merlin_flow.workspace.repo_map``)."""


ROLE_HEADING = "Your role:"
INSTRUCTIONS_HEADING = "The repository's instructions ({file}):"
SKIPPED = "not run: finish came first and ended the attempt"
"""The answer to calls a reply made after its `finish` call."""
MAX_KEPT_CHARS = 120_000
"""Longest reply text, call arguments or tool answer the conversation keeps whole (above
the file tools' own ``MAX_READ_CHARS``, so that their replies keep their notes)."""
MAX_NAME_KEPT = 200
"""Longest tool name a kept call repeats (a hostile model's is cut)."""
MAX_CALLS_PER_REPLY = 50
"""Most tool calls of one reply that are run; the others are answered ``TOO_MANY``."""
TOO_MANY = f"not run: a reply may make at most {MAX_CALLS_PER_REPLY} tool calls"


def system_prompt(brief: StepBrief) -> str:
    """The system prompt: merlin's, then the agent's role and the repository's instructions."""
    parts = [SYSTEM_PROMPT]
    if brief.role_prompt.strip():
        parts.append(f"{ROLE_HEADING}\n{brief.role_prompt.strip()}\n")
    if brief.instructions.strip():
        heading = INSTRUCTIONS_HEADING.format(file=brief.instructions_file or "AGENTS.md")
        parts.append(f"{heading}\n{brief.instructions.strip()}\n")
    return "\n".join(parts)


def first_messages(brief: StepBrief, feedback: str | None) -> list[dict[str, Any]]:
    """The opening conversation of an attempt."""
    lines = [
        f"Step {brief.step_key} ({brief.step_type}): {brief.description}",
        f"Done when: {brief.verification}" if brief.verification else "",
        f"Exit command that must succeed: {brief.exit_command}",
    ]
    if brief.constraints:
        lines += ["", "Constraints from the project's specs:", brief.constraints]
    if feedback:
        lines += ["", "Earlier attempts at this step failed:", feedback]
    if brief.repo_map:  # last: the first thing a refusal for length drops
        lines += ["", MAP_HEADING, brief.repo_map]
    user = "\n".join(line for line in lines if line).strip()
    return [
        {"role": "system", "content": system_prompt(brief)},
        {"role": "user", "content": user},
    ]


@dataclass
class AgentResult:
    """How an attempt's conversation ended."""

    summary: str
    turns: int
    finished: bool = False
    """True when the model called `finish`; False when it stopped calling tools."""


CallHook = Callable[[int, Completion | None, BaseException | None], None]


def for_the_record(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as the store keeps it: no system prompt, long texts cut."""
    kept = []
    for message in messages:
        if message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str) and len(content) > TRANSCRIPT_CHARS:
            message = {**message, "content": content[:TRANSCRIPT_CHARS] + "\n[... cut]"}
        kept.append(message)
    return kept


def run_agent(
    tier: Tier,
    brief: StepBrief,
    toolbox: Toolbox,
    feedback: str | None,
    on_call: CallHook,
    check_alive: Callable[[], None] = lambda: None,
    *,
    limits: Limits | None = None,
    call_model: ModelCall = complete,
    sleep: Callable[[float], None] = time.sleep,
    transcript: list[dict[str, Any]] | None = None,
    on_progress: Callable[[list[dict[str, Any]]], None] = lambda _messages: None,
    on_condense: Callable[[Condensation], None] = lambda _condensation: None,
) -> AgentResult:
    """Converse with ``tier``'s model until it stops calling tools.

    ``on_call(turn, completion, error)`` is told of every model call, retries included
    (the journal); ``check_alive()`` runs before each call and each tool call, and may
    raise to stop the attempt. ``on_progress(messages)`` is given the conversation after
    each reply (before its tools run) and after its tools ran: what a live view shows.
    ``on_condense`` is told of each condensation (``merlin_flow.agents.condense``).
    A transiently failing call is retried on the same tier as ``limits`` says
    (``merlin_flow.failures.decide``). Raises AgentError when the model fails for
    good or the turn limit is reached, BudgetExceeded when the budget stops the job.
    """
    messages = transcript if transcript is not None else []
    messages[:] = first_messages(brief, feedback)
    return converse(
        tier,
        messages,
        toolbox,
        on_call,
        check_alive,
        limits=limits,
        call_model=call_model,
        sleep=sleep,
        on_progress=on_progress,
        on_condense=on_condense,
    )


def converse(
    tier: Tier,
    messages: list[dict[str, Any]],
    toolbox: Toolbox,
    on_call: CallHook,
    check_alive: Callable[[], None] = lambda: None,
    *,
    limits: Limits | None = None,
    call_model: ModelCall = complete,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[list[dict[str, Any]]], None] = lambda _messages: None,
    on_condense: Callable[[Condensation], None] = lambda _condensation: None,
) -> AgentResult:
    """The loop of ``run_agent`` from ``messages`` on.

    It offers the toolbox's tools and the context's own (``read_output``, ``todo``) only.
    Every request fits the tier's window: tool answers are bounded and the conversation
    condensed (``AttemptContext``). ``on_progress`` and, at the end, ``messages`` hold the
    whole conversation: what was condensed, each condensation's note, what followed.
    """
    limits = limits or Limits()
    context = AttemptContext(tier, toolbox, call_model, on_call, on_condense)
    try:
        for turn in range(limits.max_turns):
            context.before_request(messages, turn)
            reply = _call(
                context.tier, messages, turn, limits, on_call, check_alive, call_model, sleep,
                context,
            )  # fmt: skip
            context.after_reply(reply)
            message, calls = reply.message, reply.tool_calls
            if not calls:
                calls = text_tool_calls(message.get("content"), toolbox.names, f"text-{turn}")
                if calls:  # carried as real calls, so that providers accept their answers
                    message = {**message, "tool_calls": calls}
            messages.append(kept(context.kept_reply(message, MAX_KEPT_CHARS)))
            on_progress(context.record(messages))
            text = str(message.get("content") or "").strip()
            if not calls:
                return AgentResult(summary=text, turns=turn + 1)
            summary = _run_calls(calls, toolbox, messages, turn, check_alive, context.bound)
            on_progress(context.record(messages))
            context.settle(messages)
            if summary is not None:
                return AgentResult(summary=summary or text, turns=turn + 1, finished=True)
        raise AgentError(f"turn limit reached: {limits.max_turns} model replies without finishing")
    finally:  # the record keeps the whole conversation, not what condensation left of it
        messages[:] = context.record(messages)


def _run_calls(
    calls: list[dict[str, Any]],
    toolbox: Toolbox,
    messages: list[dict[str, Any]],
    turn: int,
    check_alive: Callable[[], None],
    bound: Callable[[str, str], str],
) -> str | None:
    """Run a reply's calls in order and answer each; the summary if `finish` was one.

    Each answer is kept as ``bound(answer, tool)`` says. Calls after an accepted `finish`
    are not run; they are answered as skipped.
    """
    for index, call in enumerate(calls):
        call = call if isinstance(call, dict) else {}
        if index >= MAX_CALLS_PER_REPLY:
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": TOO_MANY})
            continue
        check_alive()  # a command boundary: a cancelled job stops here
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name, arguments = function.get("name", ""), function.get("arguments") or "{}"
        output = toolbox.call(name, arguments, turn=turn)
        kept_output = bound(_cut(output), str(name))
        messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": kept_output})
        if name == FINISH and output == FINISHED:
            for later in calls[index + 1 :]:
                later_id = later.get("id") if isinstance(later, dict) else None
                messages.append({"role": "tool", "tool_call_id": later_id, "content": SKIPPED})
            return str(parse_arguments(name, arguments)["summary"]).strip()
    return None


def kept(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as the conversation keeps it: long text and arguments cut and marked.

    Cut arguments stay a JSON object (providers parse them) that says what was cut.
    """
    content = message.get("content")
    if isinstance(content, str) and len(content) > MAX_KEPT_CHARS:
        message = {**message, "content": _cut(content)}
    calls = message.get("tool_calls")
    if isinstance(calls, list) and any(_long_arguments(call) for call in calls):
        message = {**message, "tool_calls": [_kept_call(call) for call in calls]}
    return message


def _cut(text: str) -> str:
    if len(text) <= MAX_KEPT_CHARS:
        return text
    return text[:MAX_KEPT_CHARS] + f"\n[cut by merlin: {len(text)} characters in all]"


def _long_arguments(call: object) -> bool:
    """Whether a call's arguments (or its name) are too long to keep."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    long_name = isinstance(name, str) and len(name) > MAX_NAME_KEPT
    return long_name or (isinstance(arguments, str) and len(arguments) > MAX_KEPT_CHARS)


def _kept_call(call: Any) -> Any:
    if not _long_arguments(call):
        return call
    function = dict(call["function"])
    arguments, name = function.get("arguments"), function.get("name")
    if isinstance(name, str) and len(name) > MAX_NAME_KEPT:
        function["name"] = name[:MAX_NAME_KEPT]
    if isinstance(arguments, str) and len(arguments) > MAX_KEPT_CHARS:
        note = f"cut by merlin: arguments of {len(arguments)} characters, not kept"
        function["arguments"] = json.dumps({"merlin": note})
    return {**call, "function": function}


def _call(
    tier: Tier,
    messages: list[dict[str, Any]],
    turn: int,
    limits: Limits,
    on_call: CallHook,
    check_alive: Callable[[], None],
    call_model: ModelCall,
    sleep: Callable[[float], None],
    context: AttemptContext,
) -> Completion:
    """One model turn: a request, retried while its failures are transient.

    Each request is one HTTP request, journaled by ``on_call``. The turn as a whole,
    waits included, lasts at most ``limits.turn_timeout``: each request gets what is left
    of it (at most the tier's own timeout). A 5xx that recurs, word for word, on the same
    request is the server's answer to it, not bad luck: it ends the attempt. A request
    refused as too long for the window is condensed and sent again, once.
    """
    deadline = time.monotonic() + limits.turn_timeout
    retries = 0
    last: ModelFailure | None = None
    condensed = False
    while True:
        check_alive()
        left = deadline - time.monotonic()
        if left <= 0:
            raise AgentError(_out_of_time(tier, limits, retries, last))
        bounded = tier if tier.timeout <= left else tier.model_copy(update={"timeout": left})
        try:
            reply = call_model(bounded, messages, context.schemas)
        except BudgetExceeded:
            raise  # refused before the call: nothing was sent, nothing to journal
        except Exception as exc:  # every model error is expected input, never a crash
            on_call(turn, None, exc)
            failure = examine(exc)
            server_error = failure.status is not None and failure.status >= 500
            if server_error and failure.same_as(last):
                failure = ModelFailure(
                    FailureKind.CAPABILITY, f"{failure.what}, twice alike", failure.status,
                    failure.detail,
                )  # fmt: skip
            last = failure
            if failure.what == CONTEXT_EXCEEDED and not condensed:
                condensed = True  # our count was low: condense harder and ask again, once
                context.overflowed(messages)
                continue
            decision = decide(
                Failure(failure.kind, failure.reason),
                tier_index=0,
                next_tier=None,
                limits=limits,
                call_retries=retries,
            )
            if decision.action is Action.RETRY_CALL:
                delay = max(decision.delay, retry_after(exc) or 0.0)
                if time.monotonic() + delay >= deadline:
                    raise AgentError(_out_of_time(tier, limits, retries + 1, failure)) from None
                sleep(delay)
                retries += 1
                continue
            if decision.action is Action.STOP_JOB:
                raise BudgetExceeded(failure.reason) from None
            if failure.kind is FailureKind.ACCESS:
                raise ModelUnreachable(
                    f"{MODEL_UNREACHABLE}{describe(tier)}: {failure.reason}"
                ) from None
            after = f" after {retries} retries" if retries else ""
            raise AgentError(
                f"model call failed on {describe(tier)}{after}: {failure.reason}"
            ) from None
        on_call(turn, reply, None)
        return reply


def _out_of_time(tier: Tier, limits: Limits, requests: int, last: ModelFailure | None) -> str:
    why = f": {last.reason}" if last else ""
    return (
        f"model turn on {describe(tier)} took over {limits.turn_timeout:g} s "
        f"(limits.turn_timeout) in {requests} request(s){why}"
    )
