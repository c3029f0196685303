"""Hostile model output: each case ends the step cleanly, the process alive, memory bounded.

The real Toolbox, the real agent loop and the real sandbox (bubblewrap where it works,
and ``mode = "none"``); the model is a pure function of the conversation, so that it can
send what no script file should hold (a 200 MB call).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

from merlin_flow.agents.loop import (
    MAX_CALLS_PER_REPLY,
    MAX_KEPT_CHARS,
    TOO_MANY,
    AgentResult,
    StepBrief,
    run_agent,
)
from merlin_flow.config import Limits, Tier
from merlin_flow.errors import AgentError
from merlin_flow.models.llm import MAX_ARGUMENT_CHARS, Completion
from merlin_flow.models.tokens import conversation_text, count_tokens
from merlin_flow.store.redaction import Redactor
from merlin_flow.tool_config import Sandbox, SandboxMode
from merlin_flow.tools.observations import MAX_CHARS
from merlin_flow.tools.toolbox import MAX_WRITE_BYTES, Toolbox
from merlin_flow.workspace.checkout import Checkout
from merlin_flow.workspace.process import OUTPUT_TAIL_CHARS
from merlin_flow.workspace.sandbox import Confinement, run_confined, sandbox_problem

BRIEF = StepBrief("s1", "code", "be attacked", "", "true")
TIER = Tier(name="hostile", model="function/hostile", context_window=1_000_000)
"""A window that 5,000 calls fit: these tests are about memory and time, not condensation."""
NONE = Sandbox(mode=SandboxMode.NONE)
MODES = [
    pytest.param(SandboxMode.BWRAP, id="bwrap"),
    pytest.param(SandboxMode.NONE, id="none"),
]

Reply = dict[str, Any]


def tool_call(name: Any, arguments: Any, index: int = 0) -> dict[str, Any]:
    return {
        "id": f"c{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def finish(summary: str = "done") -> Reply:
    return {"content": "", "tool_calls": [tool_call("finish", json.dumps({"summary": summary}))]}


class Model:
    """A model that answers turn N with ``replies[N]``; it records each request's size."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = replies
        self.request_chars: list[int] = []

    def __call__(
        self, tier: Tier, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> Completion:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        self.request_chars.append(len(json.dumps(messages)))
        reply = self.replies[min(turn, len(self.replies) - 1)]
        return Completion({"role": "assistant", **reply}, 1, 1, 0.0, 1.0, f"h{turn}")


def converse(
    root: Path, model: Model, max_turns: int = 5, transcript: list[dict[str, Any]] | None = None
) -> AgentResult:
    return run_agent(
        TIER,
        BRIEF,
        Toolbox(Checkout.folder(root, NONE)),
        None,
        lambda *_: None,
        limits=Limits(max_turns=max_turns),
        call_model=model,
        transcript=transcript,
    )


def needs_bwrap(mode: SandboxMode) -> None:
    if mode is SandboxMode.BWRAP and sandbox_problem():
        pytest.skip(f"bubblewrap cannot run here: {sandbox_problem()}")


# Malformed arguments and unknown tools ---------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    ["{not json", 5, [1, 2], "[" * 100_000, '"a string"', "null", '{"path": 3, "content": "x"}'],
    ids=["not-json", "int", "list", "deep", "string", "null", "wrong-type"],
)
def test_malformed_arguments_are_answered_never_raised(tmp_path: Path, arguments: Any) -> None:
    reply = Toolbox(Checkout.folder(tmp_path, NONE)).call("write_file", arguments)
    assert reply.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_malformed_calls_end_the_step_cleanly(tmp_path: Path) -> None:
    calls: list[Any] = [
        "not a call",
        {"id": "x", "function": "not a function"},
        tool_call(["a", "list"], "{}", 2),
        tool_call(None, "{}", 3),
        tool_call("write_file", "[" * 100_000, 4),
        tool_call("x" * 1_000_000, "{}", 5),
    ]
    transcript: list[dict[str, Any]] = []
    result = converse(
        tmp_path, Model({"content": "", "tool_calls": calls}, finish()), transcript=transcript
    )
    assert result.finished
    assert result.summary == "done"
    answers = [m["content"] for m in transcript if m["role"] == "tool"]
    assert len(answers) == len(calls) + 1
    assert all(a.startswith("error: ") for a in answers[:-1])
    assert "unknown tool 'xxxx" in answers[-2]
    assert len(answers[-2]) < 500


# A 10 MB reply ---------------------------------------------------------------------------


def test_a_10_mb_reply_is_cut_in_the_conversation(tmp_path: Path) -> None:
    huge = "All work and no play. " * 500_000  # 11 MB
    model = Model({"content": huge, "tool_calls": [tool_call("list_files", "{}")]}, finish())
    transcript: list[dict[str, Any]] = []
    started = time.monotonic()
    result = converse(tmp_path, model, transcript=transcript)
    assert result.finished
    assert time.monotonic() - started < 10
    kept = transcript[2]["content"]
    assert len(kept) < MAX_KEPT_CHARS + 100
    assert kept.endswith(f"{len(huge)} characters in all]")
    assert model.request_chars[1] < 2 * MAX_KEPT_CHARS  # not sent again whole


def test_a_10_mb_final_reply_is_a_summary_and_counts_and_redacts(tmp_path: Path) -> None:
    huge = "secret-value-1234 " * 600_000
    started = time.monotonic()
    result = converse(tmp_path, Model({"content": huge}))
    assert not result.finished
    assert len(result.summary) == len(huge.strip())
    assert count_tokens(conversation_text([{"role": "assistant", "content": huge}])) > 2_000_000
    assert "secret-value-1234" not in Redactor(["secret-value-1234"]).redact(huge)
    assert time.monotonic() - started < 10


# NUL bytes and invalid Unicode ------------------------------------------------------------


def test_nul_bytes_are_written_faithfully(tmp_path: Path) -> None:
    tools = Toolbox(Checkout.folder(tmp_path, NONE))
    assert tools.call(
        "write_file", json.dumps({"path": "n.txt", "content": "a\u0000b"})
    ).startswith("wrote 3")
    assert (tmp_path / "n.txt").read_bytes() == b"a\x00b"
    assert tools.call("read_file", {"path": "n.txt"}) == "a\x00b"
    assert tools.call("edit_file", {"path": "n.txt", "old": "\x00", "new": "-"}) == "edited n.txt"
    assert (tmp_path / "n.txt").read_bytes() == b"a-b"


def test_lone_surrogates_are_refused_and_the_file_is_kept(tmp_path: Path) -> None:
    tools = Toolbox(Checkout.folder(tmp_path, NONE))
    (tmp_path / "f.txt").write_text("keep me\n")
    for name, arguments in [
        ("write_file", '{"path": "f.txt", "content": "bad \\udcff"}'),
        ("edit_file", '{"path": "f.txt", "old": "keep", "new": "\\udcff"}'),
        ("edit_file", '{"path": "f.txt", "old": "\\ud800", "new": "x"}'),
    ]:
        reply = tools.call(name, arguments)
        assert reply.startswith("error: "), reply
        assert "lone surrogate" in reply
        assert (tmp_path / "f.txt").read_text() == "keep me\n"  # never truncated


def test_a_file_that_is_not_utf8_is_an_error_reply(tmp_path: Path) -> None:
    (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00\x80")
    tools = Toolbox(Checkout.folder(tmp_path, NONE))
    for name, arguments in [
        ("read_file", {"path": "b.bin"}),
        ("edit_file", {"path": "b.bin", "old": "a", "new": "b"}),
    ]:
        assert tools.call(name, arguments).startswith(
            f"error: {name} failed: the file is not UTF-8"
        )
    assert tools.call("grep", {"pattern": "a"}) == "(no matches)"


# A 200 MB write_file ---------------------------------------------------------------------

BIG_WRITE = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from merlin_flow.agents.loop import run_agent, StepBrief
    from merlin_flow.config import Limits, Tier
    from merlin_flow.models.llm import Completion, litellm_module
    from merlin_flow.tool_config import Sandbox, SandboxMode
    from merlin_flow.tools.toolbox import Toolbox
    from merlin_flow.workspace.checkout import Checkout

    litellm_module()  # loaded in every worker: the token counter uses its tokenizers
    START = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # code loaded
    root = Path(sys.argv[1])
    size = int(sys.argv[2])
    chunks = ["x" * 2**20] * (size // 2**20)  # one chunk, joined once: one copy held
    arguments = "".join(['{"path": "big.txt", "content": "', *chunks, '"}'])
    transcript = []

    def model(tier, messages, tools):
        turn = sum(1 for m in messages if m["role"] == "assistant")
        call = ("write_file", arguments) if turn == 0 else ("finish", '{"summary": "ok"}')
        fn = {"name": call[0], "arguments": call[1]}
        message = {"role": "assistant", "tool_calls": [{"id": "c", "function": fn}]}
        return Completion(message, 1, 1, 0.0, 1.0, "h")

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    before = rss()
    result = run_agent(
        Tier(name="t", model="function/t"), StepBrief("s", "code", "d", "", "true"),
        Toolbox(Checkout.folder(root, Sandbox(mode=SandboxMode.NONE))), None, lambda *_: None,
        limits=Limits(max_turns=3), call_model=model, transcript=transcript,
    )
    del arguments
    print(json.dumps({
        "start": START, "before": before, "after": rss(), "summary": result.summary,
        "answer": transcript[3]["content"], "kept": len(json.dumps(transcript)),
    }))
    """
)


def test_a_200_mb_write_is_refused_with_memory_bounded(tmp_path: Path) -> None:
    size = 200 * 2**20
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", BIG_WRITE, str(tmp_path), str(size)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(proc.stdout)
    assert seen["summary"] == "ok"  # the step went on and finished
    assert seen["answer"].startswith("error: arguments of write_file are")
    assert str(MAX_ARGUMENT_CHARS) in seen["answer"]
    assert not (tmp_path / "big.txt").exists()
    assert seen["kept"] < 10_000  # the conversation does not keep the 200 MB
    # The reply itself is 200 MB; handling it adds well under 50 MB to the peak (it added
    # 400 MB when the arguments were parsed, encoded and kept whole).
    assert seen["after"] - seen["before"] < 50 * 2**20, seen
    assert seen["after"] - seen["start"] < 300 * 2**20, seen
    assert time.monotonic() - started < 60


def test_a_write_over_the_limit_is_refused_before_the_file_is_touched(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("old\n")
    content = "y" * (MAX_WRITE_BYTES + 1)
    tracemalloc.start()
    try:
        reply = Toolbox(Checkout.folder(tmp_path, NONE)).call(
            "write_file", {"path": "f.txt", "content": content}
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reply.startswith("error: ")
    assert "merlin_flow.tools.toolbox.MAX_WRITE_BYTES" in reply
    assert (tmp_path / "f.txt").read_text() == "old\n"
    assert peak < 2 * MAX_WRITE_BYTES


def test_a_smaller_sandbox_file_limit_is_the_one_named(tmp_path: Path) -> None:
    tools = Toolbox(Checkout.folder(tmp_path, Sandbox(mode=SandboxMode.NONE, max_file_size_mb=1)))
    reply = tools.call("write_file", {"path": "f.txt", "content": "z" * (2**20 + 1)})
    assert "[sandbox] max_file_size_mb" in reply
    (tmp_path / "g.txt").write_text("a" * 2**19)
    reply = tools.call("edit_file", {"path": "g.txt", "old": "a" * 2**19, "new": "b" * 2**21})
    assert "[sandbox] max_file_size_mb" in reply
    assert (tmp_path / "g.txt").read_text() == "a" * 2**19


# A model that never stops calling tools -------------------------------------------------


def test_a_model_that_never_stops_ends_at_the_turn_limit(tmp_path: Path) -> None:
    model = Model({"content": "", "tool_calls": [tool_call("list_files", "{}")]})
    with pytest.raises(AgentError, match=r"turn limit reached: 7 model replies"):
        converse(tmp_path, model, max_turns=7)
    assert len(model.request_chars) == 7


def test_a_reply_with_thousands_of_calls_runs_a_bounded_number(tmp_path: Path) -> None:
    calls = [
        tool_call("write_file", json.dumps({"path": f"f{i}.txt", "content": "x"}), i)
        for i in range(5000)
    ]
    transcript: list[dict[str, Any]] = []
    result = converse(
        tmp_path, Model({"content": "", "tool_calls": calls}, finish()), transcript=transcript
    )
    assert result.finished
    assert len(list(tmp_path.glob("f*.txt"))) == MAX_CALLS_PER_REPLY
    answers = [m for m in transcript if m["role"] == "tool"]
    assert len(answers) == 5001  # every call is answered, as providers require
    assert answers[MAX_CALLS_PER_REPLY]["content"] == TOO_MANY


# Commands: 100 MB of output, a daemon left behind ----------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_command_printing_100_mb_costs_no_memory(tmp_path: Path, mode: SandboxMode) -> None:
    needs_bwrap(mode)
    command = "yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 104857600; echo; echo end"
    tracemalloc.start()
    try:
        result = run_confined(
            ["/bin/sh", "-c", command], Confinement(tmp_path), Sandbox(mode=mode), 60
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok
    assert result.output_tail.endswith("end\n")
    assert len(result.output_tail) == OUTPUT_TAIL_CHARS
    assert peak < 2 * 2**20
    assert result.duration < 30


def sleepers(mark: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def gone(mark: str, wait: float = 3.0) -> bool:
    """True once no process runs ``sleep <mark>`` (zombies waiting for init aside)."""
    deadline = time.monotonic() + wait
    while True:
        alive = [p for p in sleepers(mark) if _state(p) not in ("Z", "X", "")]
        if not alive:
            return True
        if time.monotonic() > deadline:
            for pid in alive:  # leave nothing behind, whatever the assertion says
                os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return next((ln.split()[1] for ln in status.splitlines() if ln.startswith("State:")), "")


def daemon_command() -> tuple[str, str]:
    mark = f"1000.{uuid.uuid4().int % 10**12}"  # sleep takes it; pgrep finds it
    return mark, f"setsid sleep {mark} >/dev/null 2>&1 </dev/null & echo started"


@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_left_by_a_command_is_killed(tmp_path: Path, mode: SandboxMode) -> None:
    needs_bwrap(mode)
    mark, command = daemon_command()
    result = run_confined(["/bin/sh", "-c", command], Confinement(tmp_path), Sandbox(mode=mode), 30)
    assert result.ok
    assert result.output_tail == "started\n"
    assert result.duration < 5
    assert gone(mark), f"`setsid sleep {mark} &` outlived its command ({mode})"


@pytest.mark.parametrize("mode", MODES)
def test_a_daemon_left_by_the_run_command_tool_is_killed(tmp_path: Path, mode: SandboxMode) -> None:
    needs_bwrap(mode)
    mark, command = daemon_command()
    tools = Toolbox(Checkout.folder(tmp_path, Sandbox(mode=mode)))
    assert tools.call("run_command", {"command": command}) == "exit code: 0\nstarted\n"
    assert gone(mark), f"`setsid sleep {mark} &` outlived the tool call ({mode})"
    assert tools.call("run_command", {"command": "echo next"}) == "exit code: 0\nnext\n"


def test_a_long_tool_answer_is_cut_and_a_truncated_read_keeps_its_note(tmp_path: Path) -> None:
    (tmp_path / "wide.txt").write_text(("match " + "w" * 2000 + "\n") * 150)
    (tmp_path / "long.txt").write_text(("r" * 150 + "\n") * 1000)
    calls = [
        tool_call("grep", json.dumps({"pattern": "match"}), 0),
        tool_call("read_file", json.dumps({"path": "long.txt"}), 1),
    ]
    transcript: list[dict[str, Any]] = []
    converse(tmp_path, Model({"content": "", "tool_calls": calls}, finish()), transcript=transcript)
    grep, read = [m["content"] for m in transcript if m["role"] == "tool"][:2]
    assert len(grep) < MAX_CHARS
    assert "grep's output cut to fit the context" in grep
    assert '"output": 1' in grep
    assert "read on with start_line" in read
    assert len(read) < MAX_CHARS


def test_a_huge_reply_is_bounded_before_the_journal_keeps_it() -> None:
    from types import SimpleNamespace

    from merlin_flow.models.llm import MAX_REPLY_CHARS, _message_dict

    huge = "x" * (10 * 2**20)
    call = SimpleNamespace(
        id="c0", function=SimpleNamespace(name="write_file", arguments="{" + huge + huge)
    )
    small = SimpleNamespace(id="c1", function=SimpleNamespace(name="list_files", arguments="{}"))
    message = _message_dict(SimpleNamespace(content=huge, tool_calls=[call, small]))
    assert len(message["content"]) < MAX_REPLY_CHARS + 100
    assert message["content"].endswith(f"cut at {MAX_REPLY_CHARS} characters]")
    arguments = [c["function"]["arguments"] for c in message["tool_calls"]]
    assert arguments == [("{" + huge)[: MAX_ARGUMENT_CHARS + 1], "{}"]
    # ... which the tool refuses as it refuses the whole 20 MB.
    answer = Toolbox(Checkout.folder(Path("."), NONE)).call("write_file", arguments[0])
    assert answer.startswith("error: arguments of write_file are")
