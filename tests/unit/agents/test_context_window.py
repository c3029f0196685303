"""A conversation's context budget over real HTTP (agents.context_window).

The model is the OpenAI-compatible test server enforcing a window with its own count
(tests/model_server.py): what it refuses, merlin sent.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from merlin_flow.agents.context_window import REPLY_SHARE, AttemptContext
from merlin_flow.agents.loop import run_agent
from merlin_flow.config import Limits, Tier
from merlin_flow.models.llm import Completion, complete
from merlin_flow.tools.toolbox import Toolbox
from tests.bench.context import BRIEF, FEEDBACK, make_repo, run_step, summary_reply, trajectory
from tests.model_server import ModelServer, prompt_tokens


def test_a_step_whose_tools_emit_three_windows_finishes_with_every_request_in_bounds(
    tmp_path: Path,
) -> None:
    window = 4096
    run = run_step(make_repo(tmp_path / "repo"), window, rounds=8)
    assert run.error == ""
    assert run.result is not None
    assert run.result.finished
    assert run.emitted_tokens > 3 * window
    assert run.refused == 0
    assert run.server_peak <= 0.85 * window
    assert run.counter_peak <= 0.85 * window
    assert run.condensations
    assert all(not c.forced for c in run.condensations)
    assert run.pinned_checked > 0
    assert run.pinned_whole == run.pinned_checked


def test_a_refusal_for_length_condenses_once_and_retries_never_escalates(tmp_path: Path) -> None:
    calls: list[tuple[int, Completion | None, BaseException | None]] = []
    condensed: list[Any] = []
    repo = make_repo(tmp_path / "repo")
    # The tier claims twice the window the server holds: merlin's count is low, by far.
    with ModelServer(window=3000, respond=summary_reply) as server:
        server.queue(*trajectory(2))
        tier = Tier(name="t", model="openai/tiny-model", api_base=server.url,
                    context_window=6000, max_tokens=256)  # fmt: skip
        result = run_agent(
            tier, BRIEF, Toolbox(repo), FEEDBACK, lambda *call: calls.append(call),
            limits=Limits(max_turns=40, retry_base_delay=0.0), on_condense=condensed.append,
        )  # fmt: skip
    assert result.finished
    refused = [error for _turn, _reply, error in calls if error is not None]
    assert refused
    assert all("maximum context length" in str(e) for e in refused)
    forced = [c for c in condensed if c.forced]
    assert len(forced) == len(refused)  # each refusal: one forced condensation, one retry
    sizes = [prompt_tokens(request.body) for request in server.requests]
    for before, after in itertools.pairwise(sizes):
        if before > 3000:  # refused: the request sent again is smaller, and fits
            assert after < before
            assert after <= 3000


def test_the_server_reported_count_calibrates_the_estimate(tmp_path: Path) -> None:
    with ModelServer(window=100_000) as server:
        tier = Tier(name="t", model="openai/tiny-model", api_base=server.url)
        context = AttemptContext(tier, Toolbox(tmp_path), complete, lambda *_: None)
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi " * 300}]
        context.before_request(messages, 0)
        reply = complete(tier, messages, context.schemas)
        context.after_reply(reply)
        # The server counts the JSON, 3.5 characters a token: more than the tokenizer.
        assert context.counter.scale == reply.prompt_tokens / context.counter.raw(
            messages, context.schemas
        )
        assert context.counter(messages, context.schemas) >= reply.prompt_tokens


def test_the_context_offers_read_output_and_todo_and_bounds_replies(tmp_path: Path) -> None:
    tier = Tier(name="t", model="scripted/x.yaml", context_window=2048)
    toolbox = Toolbox(tmp_path)
    context = AttemptContext(tier, toolbox, complete, lambda *_: None)
    assert {"read_output", "todo"} <= set(toolbox.names)
    assert toolbox.read_chars < context.observations.chars
    reply = context.kept_reply({"role": "assistant", "content": "w" * 50_000}, 120_000)
    assert len(reply["content"]) < int(2048 * REPLY_SHARE) * 4 + 100
    assert reply["content"].endswith("[cut by merlin: 50000 characters in all]")
    written = {"id": "c", "function": {"name": "write_file",
               "arguments": json.dumps({"path": "a", "content": "x" * 9000})}}  # fmt: skip
    messages = [{"role": "assistant", "content": "", "tool_calls": [written]}]
    context.settle(messages)
    masked = messages[0]["tool_calls"][0]["function"]["arguments"]
    assert "hidden to keep the context small" in masked


def test_the_record_keeps_the_whole_conversation_across_condensations(tmp_path: Path) -> None:
    transcript: list[dict[str, Any]] = []
    repo = make_repo(tmp_path / "repo")
    with ModelServer(window=4096, respond=summary_reply) as server:
        replies = trajectory(4)
        server.queue(*replies)
        tier = Tier(name="t", model="openai/tiny-model", api_base=server.url,
                    context_window=4096, max_tokens=256)  # fmt: skip
        condensed: list[Any] = []
        run_agent(
            tier, BRIEF, Toolbox(repo), FEEDBACK, lambda *_: None, transcript=transcript,
            limits=Limits(max_turns=60), on_condense=condensed.append,
        )  # fmt: skip
        last_request = server.requests[-1].body["messages"]
    assert condensed
    assert len(last_request) < len(transcript)  # the model saw less than the record holds
    calls = [m["tool_calls"][0]["id"] for m in transcript if m["role"] == "assistant"]
    assert calls == [r.message["tool_calls"][0]["id"] for r in replies]  # every reply, in order
    notes = [m for m in transcript if str(m.get("content", "")).startswith("[merlin: ")]
    assert len(notes) == sum(c.how != "masked" for c in condensed)


def test_a_reply_asks_for_at_most_a_quarter_of_a_small_window(tmp_path: Path) -> None:
    # A 4,096-token local model with the tiers' default max_tokens (4,096): asking for all
    # of it would leave the request no room.
    with ModelServer(window=4096) as server:
        tier = Tier(name="small", model="openai/tiny-model", api_base=server.url,
                    context_window=4096)  # fmt: skip
        run_agent(tier, BRIEF, Toolbox(make_repo(tmp_path / "repo")), None, lambda *_: None)
    assert tier.max_tokens == 4096
    assert [request.body["max_tokens"] for request in server.requests] == [1024]
