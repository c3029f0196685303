"""The agent loop against the offline scripted model and a real Toolbox."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from merlin_flow.agents.loop import (
    SKIPPED,
    SYSTEM_PROMPT,
    AgentResult,
    StepBrief,
    first_messages,
    run_agent,
)
from merlin_flow.config import Limits, Tier
from merlin_flow.errors import AgentError, LeaseLost
from merlin_flow.models.llm import Completion
from merlin_flow.tools.toolbox import READ_ONLY_TOOLS, Toolbox

BRIEF = StepBrief(
    step_key="s1",
    step_type="code",
    description="Make answer() return 42",
    verification="the tests pass",
    exit_command="pytest -q",
)


class Calls:
    """An on_call hook that records every model call."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, Completion | None, BaseException | None]] = []

    def __call__(
        self, seq: int, completion: Completion | None, error: BaseException | None
    ) -> None:
        self.seen.append((seq, completion, error))


def scripted_tier(tmp_path: Path, rules: list[dict[str, Any]], **extra: Any) -> Tier:
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({"rules": rules}))
    return Tier(name="local", model="scripted/" + str(path), **extra)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def agent(
    tier: Tier,
    workdir: Path,
    feedback: str | None = None,
    max_turns: int = 5,
    on_call: Calls | None = None,
) -> AgentResult:
    return run_agent(
        tier,
        BRIEF,
        Toolbox(workdir),
        feedback,
        on_call or Calls(),
        limits=Limits(max_turns=max_turns),
    )


def test_tool_calls_of_one_reply_run_in_order(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {
                "turn": 0,
                "reply": {
                    "content": "writing then editing",
                    "tool_calls": [
                        call("write_file", path="a.txt", content="one\n"),
                        call("edit_file", path="a.txt", old="one", new="two"),
                        call("edit_file", path="a.txt", old="two", new="three"),
                    ],
                },
            },
            # Only answers if every tool reply came back, in order.
            {
                "turn": 1,
                "match": r"wrote 4 characters to a\.txt\s+edited a\.txt\s+edited a\.txt",
                "reply": {"content": "  done: a.txt says three \n"},
            },
        ],
    )
    result = agent(tier, workdir)
    assert (workdir / "a.txt").read_text() == "three\n"
    assert result.summary == "done: a.txt says three"
    assert result.turns == 2


def test_refused_tool_call_is_shown_to_the_model(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"match": "outside the repository", "reply": {"content": "saw the refusal"}},
            {
                "turn": 0,
                "reply": {
                    "tool_calls": [
                        call("write_file", path="../x", content="escaped\n"),
                        {"name": "read_file", "arguments": "{not json"},
                    ]
                },
            },
        ],
    )
    calls = Calls()
    result = agent(tier, workdir, on_call=calls)
    assert result.summary == "saw the refusal"
    assert result.turns == 2
    assert not (tmp_path / "x").exists()
    assert [seq for seq, _, _ in calls.seen] == [0, 1]


def test_the_loop_ends_at_the_first_reply_without_tool_calls(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("write_file", path="f.txt", content="1")]}},
            {"turn": 1, "reply": {"tool_calls": [call("list_files")]}},
            {"turn": 2, "reply": {"content": "finished"}},
            # Never reached: the loop must stop at turn 2.
            {"reply": {"tool_calls": [call("write_file", path="late.txt", content="no")]}},
        ],
    )
    calls = Calls()
    result = agent(tier, workdir, max_turns=10, on_call=calls)
    assert result.turns == 3
    assert result.summary == "finished"
    assert len(calls.seen) == 3
    assert not (workdir / "late.txt").exists()


def test_answer_at_once_is_one_turn(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"content": "nothing to do"}}])
    assert agent(tier, workdir) == AgentResult(summary="nothing to do", turns=1)


def test_empty_answer_gives_an_empty_summary(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"content": None}}])
    assert agent(tier, workdir) == AgentResult(summary="", turns=1)


def test_turn_limit(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"tool_calls": [call("list_files")]}}])
    calls = Calls()
    with pytest.raises(AgentError, match="turn limit reached: 3 model replies"):
        agent(tier, workdir, max_turns=3, on_call=calls)
    assert [seq for seq, _, _ in calls.seen] == [0, 1, 2]


def test_no_fitting_rule_is_a_model_call_failure(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("list_files")]}},
            {"turn": 5, "reply": {"content": "unreachable"}},
        ],
    )
    calls = Calls()
    with pytest.raises(AgentError, match="model call failed on tier 'local'") as info:
        agent(tier, workdir, on_call=calls)
    assert "no rule fits the conversation at turn 1" in str(info.value)
    assert len(calls.seen) == 2
    seq, completion, error = calls.seen[1]
    assert (seq, completion) == (1, None)
    assert error is not None


def test_missing_script_is_a_model_call_failure(tmp_path: Path, workdir: Path) -> None:
    tier = Tier(name="local", model="scripted/" + str(tmp_path / "missing.yaml"))
    with pytest.raises(AgentError, match="model call failed on tier 'local'") as info:
        agent(tier, workdir)
    assert "does not exist" in str(info.value)


def test_on_call_once_per_model_call_with_usage(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("write_file", path="u.txt", content="u")]}},
            {"turn": 1, "reply": {"content": "ok"}},
        ],
        price_in=1.0,
        price_out=2.0,
    )
    calls = Calls()
    agent(tier, workdir, on_call=calls)
    assert [seq for seq, _, _ in calls.seen] == [0, 1]
    for _seq, completion, error in calls.seen:
        assert error is None
        assert completion is not None
        assert completion.prompt_tokens > 0
        assert completion.completion_tokens > 0
        expected = (completion.prompt_tokens * 1.0 + completion.completion_tokens * 2.0) / 1e6
        assert completion.cost_usd == pytest.approx(expected)
        assert len(completion.request_hash) == 64
    first, second = (c for _, c, _ in calls.seen)
    assert first is not None
    assert second is not None
    # The second request carries the whole conversation so far.
    assert second.prompt_tokens > first.prompt_tokens
    assert [c["function"]["name"] for c in first.tool_calls] == ["write_file"]
    assert second.tool_calls == []


def test_check_alive_runs_before_each_model_and_tool_call_and_can_stop(
    tmp_path: Path, workdir: Path
) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"tool_calls": [call("list_files")]}}])
    checks: list[int] = []
    calls = Calls()

    def check_alive() -> None:
        checks.append(len(calls.seen))
        if len(checks) == 4:
            raise LeaseLost("another worker took the step")

    with pytest.raises(LeaseLost):
        run_agent(
            tier, BRIEF, Toolbox(workdir), None, calls, check_alive, limits=Limits(max_turns=10)
        )
    # model call 1, its tool call, model call 2, its tool call (stopped there)
    assert checks == [0, 1, 1, 2]
    assert len(calls.seen) == 2


def test_feedback_is_in_the_first_user_message() -> None:
    feedback = "exit code 1: AssertionError: assert 41 == 42"
    system, user = first_messages(BRIEF, feedback)
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user"
    assert "Step s1 (code): Make answer() return 42" in user["content"]
    assert "Done when: the tests pass" in user["content"]
    assert "Exit command that must succeed: pytest -q" in user["content"]
    assert "Earlier attempts at this step failed:" in user["content"]
    assert user["content"].endswith(feedback)

    _, fresh = first_messages(BRIEF, None)
    assert "Earlier attempts" not in fresh["content"]
    assert "AssertionError" not in fresh["content"]


def test_brief_without_verification_has_no_done_when_line() -> None:
    brief = StepBrief("s2", "test", "Add a test", "", "pytest")
    _, user = first_messages(brief, None)
    assert "Done when" not in user["content"]
    assert "Exit command that must succeed: pytest" in user["content"]


def test_brief_without_verification_leaves_no_blank_line() -> None:
    brief = StepBrief("s2", "test", "Add a test", "", "pytest")
    _, user = first_messages(brief, None)
    assert user["content"] == "Step s2 (test): Add a test\nExit command that must succeed: pytest"


def test_the_model_sees_the_feedback(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"match": "assert 41 == 42", "reply": {"content": "fixing the off-by-one"}},
            {"reply": {"content": "no feedback seen"}},
        ],
    )
    assert agent(tier, workdir, feedback="assert 41 == 42").summary == "fixing the off-by-one"
    assert agent(tier, workdir, feedback=None).summary == "no feedback seen"


# --- transient failures: retried on the same tier with backoff, without sleeping ---------


def _rate_limited(times: int) -> tuple[Any, list[int]]:
    import litellm

    calls: list[int] = []

    def call_model(tier: Tier, messages: list[dict[str, Any]], tools: Any) -> Completion:
        calls.append(len(messages))
        if len(calls) <= times:
            raise litellm.RateLimitError(
                message="slow down", model=tier.model, llm_provider="openai"
            )
        return Completion(
            message={"role": "assistant", "content": "done"},
            prompt_tokens=1,
            completion_tokens=1,
            cost_usd=0.0,
            latency_ms=1.0,
            request_hash="h",
        )

    return call_model, calls


def test_transient_errors_are_retried_with_backoff(tmp_path: Path, workdir: Path) -> None:

    call_model, calls = _rate_limited(times=2)
    slept: list[float] = []
    seen = Calls()
    result = run_agent(
        Tier(name="fast", model="openai/x"),
        BRIEF,
        Toolbox(workdir),
        None,
        seen,
        limits=Limits(max_retry_attempts=2, retry_base_delay=0.5),
        call_model=call_model,
        sleep=slept.append,
    )
    assert result.summary == "done"
    assert slept == [0.5, 1.0]
    assert len(calls) == 3  # the same request, three times: same tier, same conversation
    assert len(set(calls)) == 1
    assert len(seen.seen) == 3  # every call, failed ones included, reaches the journal


def test_transient_errors_past_the_retries_fail_the_attempt(tmp_path: Path, workdir: Path) -> None:

    call_model, calls = _rate_limited(times=10)
    slept: list[float] = []
    with pytest.raises(AgentError, match="after 2 retries"):
        run_agent(
            Tier(name="fast", model="openai/x"),
            BRIEF,
            Toolbox(workdir),
            None,
            Calls(),
            limits=Limits(max_retry_attempts=2, retry_base_delay=0.25),
            call_model=call_model,
            sleep=slept.append,
        )
    assert slept == [0.25, 0.5]
    assert len(calls) == 3


def test_budget_errors_stop_without_retry(tmp_path: Path, workdir: Path) -> None:
    import litellm

    from merlin_flow.errors import BudgetExceeded

    def call_model(tier: Tier, messages: Any, tools: Any) -> Any:
        raise litellm.BudgetExceededError(current_cost=2.0, max_budget=1.0)

    slept: list[float] = []
    with pytest.raises(BudgetExceeded):
        run_agent(
            Tier(name="fast", model="openai/x"),
            BRIEF,
            Toolbox(workdir),
            None,
            Calls(),
            call_model=call_model,
            sleep=slept.append,
        )
    assert slept == []


def test_progress_is_reported_after_each_reply_and_after_its_tools(
    tmp_path: Path, workdir: Path
) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("write_file", path="a.txt", content="x")]}},
            {"reply": {"content": "done"}},
        ],
    )
    snapshots: list[list[str]] = []

    def on_progress(messages: list[dict[str, Any]]) -> None:
        snapshots.append([str(m["role"]) for m in messages])
        if len(snapshots) == 1:  # the tool call is known before the tool runs
            assert not (workdir / "a.txt").exists()
            assert messages[-1]["tool_calls"][0]["function"]["name"] == "write_file"

    run_agent(tier, BRIEF, Toolbox(workdir), None, Calls(), on_progress=on_progress)
    assert snapshots == [
        ["system", "user", "assistant"],
        ["system", "user", "assistant", "tool"],
        ["system", "user", "assistant", "tool", "assistant"],
    ]


# --- finish, and tool calls written as text ------------------------------------------------


def test_finish_ends_the_attempt_with_its_summary(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {
                "turn": 0,
                "reply": {
                    "content": "writing, then done",
                    "tool_calls": [
                        call("write_file", path="a.txt", content="1\n"),
                        call("finish", summary="  a.txt holds 1  "),
                        call("write_file", path="late.txt", content="no"),
                    ],
                },
            },
        ],
    )
    transcript: list[dict[str, Any]] = []
    result = run_agent(tier, BRIEF, Toolbox(workdir), None, Calls(), transcript=transcript)
    assert result == AgentResult(summary="a.txt holds 1", turns=1, finished=True)
    assert (workdir / "a.txt").read_text() == "1\n"
    assert not (workdir / "late.txt").exists()  # after finish: not run
    answers = [m["content"] for m in transcript if m["role"] == "tool"]
    assert answers == ["wrote 2 characters to a.txt", "finished", SKIPPED]


def test_finish_without_a_summary_keeps_the_reply_text(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [{"reply": {"content": " all done ", "tool_calls": [call("finish", summary="")]}}],
    )
    assert agent(tier, workdir) == AgentResult(summary="all done", turns=1, finished=True)


def test_a_malformed_finish_is_answered_and_the_loop_goes_on(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("finish", note="no summary")]}},
            {"match": "bad arguments for finish", "reply": {"content": "sorry"}},
        ],
    )
    assert agent(tier, workdir) == AgentResult(summary="sorry", turns=2, finished=False)


def test_a_reply_without_calls_ends_unfinished(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"content": "I think it is done."}}])
    result = agent(tier, workdir)
    assert (result.summary, result.finished) == ("I think it is done.", False)


WRITTEN_CALL = (
    "I will create the file.\n"
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "b.txt", "content": "hi\\n"}}'
    "\n</tool_call>"
)


def test_a_tool_call_written_as_text_runs_then_finish(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"content": WRITTEN_CALL}},
            {
                "turn": 1,
                "match": "wrote 3 characters to b.txt",
                "reply": {"content": '{"name": "finish", "parameters": {"summary": "b.txt"}}'},
            },
        ],
    )
    calls = Calls()
    transcript: list[dict[str, Any]] = []
    result = run_agent(tier, BRIEF, Toolbox(workdir), None, calls, transcript=transcript)
    assert result == AgentResult(summary="b.txt", turns=2, finished=True)
    assert (workdir / "b.txt").read_text() == "hi\n"
    assistant, answer = transcript[2], transcript[3]
    # The reply is kept as written, and carries the call so providers accept its answer.
    assert assistant["content"] == WRITTEN_CALL
    assert assistant["tool_calls"] == [
        {
            "id": "text-0-1",
            "type": "function",
            "function": {
                "name": "write_file",
                "arguments": '{"path": "b.txt", "content": "hi\\n"}',
            },
        }
    ]
    assert answer == {
        "role": "tool",
        "tool_call_id": "text-0-1",
        "content": "wrote 3 characters to b.txt",
    }
    assert transcript[4]["tool_calls"][0]["id"] == "text-1-1"
    # The journal keeps the reply as the model gave it.
    first = calls.seen[0][1]
    assert first is not None
    assert first.tool_calls == []


def test_text_calls_of_tools_not_offered_are_plain_text(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(tmp_path, [{"reply": {"content": WRITTEN_CALL}}])
    result = run_agent(
        tier,
        BRIEF,
        Toolbox(workdir, only=READ_ONLY_TOOLS),
        None,
        Calls(),
        limits=Limits(max_turns=3),
    )
    assert result == AgentResult(summary=WRITTEN_CALL, turns=1)
    assert not (workdir / "b.txt").exists()


def test_native_calls_win_over_text_calls(tmp_path: Path, workdir: Path) -> None:
    tier = scripted_tier(
        tmp_path,
        [
            {
                "turn": 0,
                "reply": {"content": WRITTEN_CALL, "tool_calls": [call("list_files")]},
            },
            {"reply": {"content": "done"}},
        ],
    )
    agent(tier, workdir)
    assert not (workdir / "b.txt").exists()


def test_the_loop_gives_the_toolbox_its_turn(tmp_path: Path, workdir: Path) -> None:
    (workdir / "c.txt").write_text("same\n")
    tier = scripted_tier(
        tmp_path,
        [
            {"turn": 0, "reply": {"tool_calls": [call("read_file", path="c.txt")]}},
            {"turn": 1, "reply": {"tool_calls": [call("read_file", path="c.txt")]}},
            {"turn": 2, "match": "unchanged since turn 0: c.txt", "reply": {"content": "ok"}},
        ],
    )
    assert agent(tier, workdir).summary == "ok"


# --- the system prompt ---------------------------------------------------------------------


def test_the_system_prompt_asks_for_finish() -> None:
    assert "call finish with a short summary" in SYSTEM_PROMPT


def test_role_prompt_and_instructions_follow_the_system_prompt() -> None:
    brief = replace(
        BRIEF,
        role_prompt="  You review code; you never edit tests.\n",
        instructions="Run `make check` before finishing.",
    )
    system, user = first_messages(brief, None)
    assert system["content"] == (
        f"{SYSTEM_PROMPT}\nYour role:\nYou review code; you never edit tests.\n"
        "\nThe repository's instructions (AGENTS.md):\nRun `make check` before finishing.\n"
    )
    assert "make check" not in user["content"]

    named = replace(BRIEF, instructions="Use tabs.", instructions_file="MERLIN.md")
    system, _ = first_messages(named, None)
    assert system["content"].endswith("The repository's instructions (MERLIN.md):\nUse tabs.\n")
    assert "Your role" not in system["content"]
    system, _ = first_messages(replace(BRIEF, role_prompt="  \n"), None)
    assert system["content"] == SYSTEM_PROMPT
