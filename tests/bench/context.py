"""Benchmark: context that fits (issue 35): stress, tokens, pinned facts.

Run: ``python -m tests.bench.context [--rounds N] [--window TOKENS] [--smoke]``, or
``--endpoint URL [--model NAME] [--key-env VAR] [--window TOKENS]`` for the solve-rate
harness (``tests/bench/solve_rate.py``) against any OpenAI-compatible server
(``--endpoint oracle``: the test server playing a model that knows each fix; ``--smoke``
runs that too).

**Stress.** One step's agent on the OpenAI-compatible test server (``tests/model_server.py``)
with a small window that the server enforces (it counts the JSON of each request, more
than merlin's tokenizer does, and refuses one over the window with HTTP 400). The
agent's trajectory is fixed (the server's queue): it keeps a todo list, then, round after
round, runs a test script that prints a 40 KB log, reads a 120 KB file (whole, then at
an offset), greps for a pattern with hundreds of hits, pages a saved output with
``read_output`` and edits a file, then finishes. Its tools emit several times the window
in all. Summary requests (the condenser's) are answered by the server's ``respond`` hook.
Reported: whether the step finished, requests refused, the largest request by merlin's
count and by the server's, as a share of the window, and condensations.

**Tokens.** The same trajectory with the same bounded tool answers and file windows, but
no masking and no condensation (``Condenser.fit`` switched off, the server's window
lifted): prompt tokens per step, by the server's count, against the condensed run's.

**Pinned facts.** Every request sent after a condensation is searched for the step's
description, its exit command, the last failing verification (the attempt's feedback),
each todo item and the worktree's changes: the share that holds all of them.

Figures go to docs/BENCHMARKS.md ("Context").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merlin_flow.agents.condense import Condensation
from merlin_flow.agents.loop import AgentResult, StepBrief, run_agent
from merlin_flow.config import Limits, Tier
from merlin_flow.models.window import PromptCounter
from merlin_flow.tools.toolbox import Toolbox
from tests.bench.solve_rate import condensing
from tests.model_server import ModelServer, Reply, prompt_tokens, text, tool_call

BRIEF = StepBrief(
    "parser",
    "Debug",
    "Fix the off-by-one in parse_rows so the last row is kept",
    "tests pass",
    "sh run_tests.sh",
)
FEEDBACK = "exit command `sh run_tests.sh` failed: AssertionError: expected 3 rows, got 2"
TODO = ["read the failing test", "find the off-by-one in parse_rows", "run the tests"]
PINNED = [BRIEF.description, BRIEF.exit_command, FEEDBACK, *TODO, "Your changes so far"]
SUMMARY = "Summary: parse_rows in big.py drops the last row; the fix is under way."
HEADING = "## Context"
HARNESS = (
    "The solve-rate harness, `python -m tests.bench.context --endpoint URL [--model NAME]`, "
    "runs\nits task set on any OpenAI-compatible endpoint with and without the map and "
    "condensation.\nNo real model is reachable where merlin is built, and Debian 12 packages "
    "no llama.cpp\nserver: its run below is against the test server playing a model that "
    "knows each fix\n(`--endpoint oracle`). It shows the harness working end to end and "
    "what the map costs in\nprompt tokens, not a solve rate."
)


def make_repo(root: Path) -> Path:
    """A git repository with a 120 KB module and a test script that prints 40 KB."""
    root.mkdir(parents=True, exist_ok=True)
    body = "".join(
        f"def helper_{n}(rows):\n    return [row for row in rows if row != {n}]\n\n"
        for n in range(2000)
    )
    (root / "big.py").write_text(body)
    lines = "".join(f"test_case_{n} ... ok (parse_rows checked row {n})\n" for n in range(800))
    (root / "run_tests.sh").write_text(f"cat <<'EOF'\n{lines}EOF\necho FAILED: 1 test\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b",
                                                 "commit", "-qm", "start"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=root, check=True)
    return root


def trajectory(rounds: int) -> list[Reply]:
    """The agent's replies, in order (the same for every window)."""
    items = [{"text": t, "state": "pending"} for t in TODO]
    replies = [tool_call("todo", {"items": items})]
    for n in range(rounds):
        replies += [
            tool_call("run_command", {"command": "sh run_tests.sh"}, f"r{n}a"),
            tool_call("read_file", {"path": "big.py"}, f"r{n}b"),
            tool_call("read_file", {"path": "big.py", "start_line": 400 + n}, f"r{n}c"),
            tool_call("grep", {"pattern": "def helper_"}, f"r{n}d"),
            tool_call("read_output", {"output": 1, "start_line": 100}, f"r{n}e"),
            tool_call(
                "write_file", {"path": f"notes_{n}.txt", "content": f"round {n}\n" * 40}, f"r{n}f"
            ),
        ]
    return [*replies, tool_call("finish", {"summary": "fixed parse_rows"}, "end")]


class CountingToolbox(Toolbox):
    """A toolbox that adds up what its tools answered, before any bound."""

    emitted_chars = 0

    def call(self, name: str, arguments: str | dict[str, Any], turn: int = 0) -> str:
        output = super().call(name, arguments, turn)
        self.emitted_chars += len(output)
        return output


@dataclass
class Run:
    """One step's run on one window."""

    window: int | None
    result: AgentResult | None = None
    error: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0
    condensations: list[Condensation] = field(default_factory=list)
    emitted_tokens: int = 0
    counter_peak: int = 0
    server_peak: int = 0
    server_total: int = 0
    pinned_checked: int = 0
    pinned_whole: int = 0


def summary_reply(body: dict[str, Any]) -> Reply | None:
    """The server's answer to the condenser's summary request (None: not one)."""
    first = body.get("messages", [{}])[0].get("content") or ""
    return text(SUMMARY) if str(first).startswith("You condense") else None


def run_step(workdir: Path, window: int, rounds: int, condense: bool = True) -> Run:
    """The trajectory on a server enforcing ``window`` (unless not ``condense``)."""
    run = Run(window if condense else None)
    with ModelServer(window=run.window, respond=summary_reply) as server, condensing(condense):
        server.queue(*trajectory(rounds))
        tier = Tier(
            name="small",
            model="openai/tiny-model",
            api_base=server.url,
            context_window=window,
            max_tokens=256,
        )
        toolbox = CountingToolbox(workdir)
        try:
            run.result = run_agent(
                tier, BRIEF, toolbox, FEEDBACK, lambda *_: None,
                limits=Limits(max_turns=rounds * 8 + 10, retry_base_delay=0.0),
                on_condense=run.condensations.append,
            )  # fmt: skip
        except Exception as exc:  # the figure says it failed; the table shows why
            run.error = f"{type(exc).__name__}: {exc}"
        counter = PromptCounter(tier)
        condensed = False
        for request in server.requests:
            body = request.body
            messages = body.get("messages", [])
            served = prompt_tokens(body)
            if run.window is not None and served > run.window:
                run.refused += 1
                continue
            run.requests.append(body)
            run.counter_peak = max(run.counter_peak, counter(messages, body.get("tools", [])))
            run.server_peak = max(run.server_peak, served)
            run.server_total += served
            text_of = json.dumps(messages)
            if str(messages[0].get("content", "")).startswith("You condense"):
                continue
            condensed = condensed or "condensed to fit the model's context" in text_of
            if condensed:
                run.pinned_checked += 1
                run.pinned_whole += all(json.dumps(fact)[1:-1] in text_of for fact in PINNED)
        run.emitted_tokens = toolbox.emitted_chars // 4
    return run


def measure(rounds: int, window: int) -> tuple[Run, Run]:
    """The small window's run and the unlimited one, each on a fresh repository."""
    with tempfile.TemporaryDirectory() as folder:
        small = run_step(make_repo(Path(folder) / "small"), window, rounds)
        large = run_step(make_repo(Path(folder) / "large"), window, rounds, condense=False)
    return small, large


def report(small: Run, large: Run) -> str:
    """The figures as a Markdown table and a few lines."""
    window = small.window or 1
    saved = 1 - small.server_total / large.server_total if large.server_total else 0.0
    hows = ", ".join(f"{c.how}{' (forced)' if c.forced else ''}" for c in small.condensations)
    rows = [
        "| figure | condensed | not condensed |",
        "|---|---|---|",
        f"| window (tokens) | {window} | {window} for tool answers, none enforced |",
        f"| step finished | {_finished(small)} | {_finished(large)} |",
        f"| tool output emitted (tokens, 4 chars each) | {small.emitted_tokens} "
        f"({small.emitted_tokens / window:.1f}x the window) | {large.emitted_tokens} |",
        f"| requests (refused by the server) | {len(small.requests)} ({small.refused}) | "
        f"{len(large.requests)} ({large.refused}) |",
        f"| largest request, merlin's count | {small.counter_peak} "
        f"({small.counter_peak / window:.0%}) | {large.counter_peak} |",
        f"| largest request, server's count | {small.server_peak} "
        f"({small.server_peak / window:.0%}) | {large.server_peak} |",
        f"| prompt tokens for the step (server) | {small.server_total} | {large.server_total} |",
        f"| condensations | {len(small.condensations)} | {len(large.condensations)} |",
        f"| requests after a condensation with every pinned fact | "
        f"{small.pinned_whole}/{small.pinned_checked} | - |",
    ]
    return "\n".join(
        [*rows, "", f"Prompt tokens saved by bounding and condensing: {saved:.0%}.",
         f"Condensations, in order: {hows or 'none'}."]
    )  # fmt: skip


def _finished(run: Run) -> str:
    if run.result is not None:
        return f"yes, {run.result.turns} turns"
    return f"no: {run.error[:120]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of noisy tool calls")
    parser.add_argument("--window", type=int, default=8192, help="the small window, tokens")
    parser.add_argument("--smoke", action="store_true", help="2 rounds; no docs written")
    parser.add_argument(
        "--endpoint",
        help="run the solve-rate harness (tests/bench/solve_rate.py) on this "
        "OpenAI-compatible base URL instead; `oracle`: the test server playing a model",
    )
    parser.add_argument("--model", default="local-model", help="the endpoint's model name")
    parser.add_argument("--key-env", help="the variable holding the endpoint's API key")
    args = parser.parse_args()
    from tests.bench.solve_rate import run

    if args.endpoint:
        print(run(args.endpoint, args.model, args.window, args.key_env))
        return
    rounds = 2 if args.smoke else args.rounds
    small, large = measure(rounds, args.window)
    text_ = report(small, large)
    print(text_)
    harness = run("oracle", "local-model", None, None)
    print(harness)
    if not args.smoke:
        from tests.bench.docs_section import write_section

        command = f"python -m tests.bench.context --rounds {rounds} --window {args.window}"
        write_section(
            Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md",
            HEADING,
            f"{HEADING}\n\n`{command}` (issue 35; docs/context.md):\n\n{text_}\n\n"
            f"{HARNESS}\n\n{harness}\n",
        )


if __name__ == "__main__":
    main()
