"""The solve-rate harness of ``python -m tests.bench.context --endpoint URL`` (issue 35).

A task set is run by a model behind any OpenAI-compatible endpoint (vLLM, llama.cpp's
``llama-server``, Ollama, a provider), in four variants: with and without the repository
map in the step's first prompt, with and without condensation. Reported per variant:
tasks solved, prompt and completion tokens, and cost (litellm's price for the model, or
"unpriced").

Each task is a bug described in words, not by path, in a Python project of about forty
modules (more than ``MAP_MIN_FILES``, so a map is given): the agent must find the
module, fix it, and ``python check.py`` must pass. Each run gets a fresh git repository;
the agent is merlin's own (``run_agent``, the step's tools, bounded observations) and
the exit command runs in the sandbox, as a step's does. A task is solved when the exit
command passes after the agent stopped.

With no real model reachable, ``--endpoint oracle`` serves the tasks from
``tests/model_server.py`` playing a model that knows each fix (it reads the module and
writes it fixed): every variant solves every task, which shows the harness working end
to end (HTTP, tools, sandbox, exit command, accounting), not a solve rate.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from merlin_flow.agents.condense import Condenser
from merlin_flow.agents.context_window import MAP_HEADING
from merlin_flow.agents.loop import StepBrief, run_agent
from merlin_flow.agents.step_tools import with_map
from merlin_flow.config import Limits, MerlinConfig, Tier
from merlin_flow.errors import MerlinError
from merlin_flow.models.llm import Completion
from merlin_flow.tools.toolbox import Toolbox
from merlin_flow.workspace.checkout import Checkout
from tests.conftest import make_repo
from tests.model_server import ModelServer, Reply, text, tool_call

FILLER_MODULES = 40
EXIT_COMMAND = "python check.py"
VARIANTS = (("map", "condense"), ("map",), ("condense",), ())
"""What each variant switches on: the first prompt's map, condensation."""


@dataclass(frozen=True)
class Task:
    """One bug: its description, the module that holds it, broken and fixed, its check."""

    name: str
    description: str
    module: str
    broken: str
    fixed: str
    check: str


TASKS = (
    Task(
        "mean",
        "The average of a list of measurements comes out too high: it seems to divide "
        "by one less than the number of values.",
        "pkg/stats.py",
        "def mean(values):\n    return sum(values) / (len(values) - 1)\n",
        "def mean(values):\n    return sum(values) / len(values)\n",
        "from pkg.stats import mean\n\nassert mean([1, 2, 3, 6]) == 3\n",
    ),
    Task(
        "slug",
        "URL slugs keep capital letters, so the same title gives two different links; "
        "slugs must be all lowercase.",
        "pkg/text.py",
        "def slugify(title):\n    return '-'.join(title.split())\n",
        "def slugify(title):\n    return '-'.join(title.lower().split())\n",
        "from pkg.text import slugify\n\nassert slugify('Hello Big World') == 'hello-big-world'\n",
    ),
    Task(
        "leap",
        "The calendar says 1900 was a leap year; century years are leap years only when "
        "divisible by 400.",
        "pkg/dates.py",
        "def is_leap(year):\n    return year % 4 == 0\n",
        "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        "from pkg.dates import is_leap\n\nassert is_leap(2000) and is_leap(2024)\n"
        "assert not is_leap(1900) and not is_leap(2023)\n",
    ),
    Task(
        "clamp",
        "Limiting a value to a range gives the upper bound when the value is below the "
        "lower bound.",
        "pkg/numbers.py",
        "def clamp(value, low, high):\n    return high if value < low else min(value, high)\n",
        "def clamp(value, low, high):\n    return max(low, min(value, high))\n",
        "from pkg.numbers import clamp\n\nassert clamp(-5, 0, 10) == 0\n"
        "assert clamp(5, 0, 10) == 5 and clamp(50, 0, 10) == 10\n",
    ),
)


def project(root: Path, task: Task) -> Path:
    """A git repository holding ``task``'s bug among ``FILLER_MODULES`` other modules."""
    files = {
        f"pkg/part_{n:02d}.py": (
            f'"""Part {n} of the pipeline."""\n\n\ndef stage_{n}(items):\n'
            f"    return [item for item in items if item != {n}]\n"
        )
        for n in range(FILLER_MODULES)
    }
    files.update({"pkg/__init__.py": "", task.module: task.broken, "check.py": task.check})
    return make_repo(root, files)


@dataclass
class Outcome:
    """What one variant did on the task set."""

    variant: tuple[str, ...]
    solved: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    """Task name: why (the agent's error, or the exit command's tail)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    mapped: int = 0
    """Tasks whose first prompt carried a map."""


def run_task(task: Task, variant: tuple[str, ...], tier: Tier, folder: Path, out: Outcome) -> None:
    """One task in one variant: the agent, then the exit command; ``out`` adds it up."""
    repo = project(folder / f"{task.name}-{'-'.join(variant) or 'plain'}", task)
    brief = StepBrief(task.name, "Debug", task.description, "check.py passes", EXIT_COMMAND)
    toolbox = Toolbox(repo)
    if "map" in variant:
        brief = with_map(brief, tier, toolbox)
        out.mapped += bool(brief.repo_map)

    def on_call(_turn: int, reply: Completion | None, _error: BaseException | None) -> None:
        if reply is None:
            return
        out.prompt_tokens += reply.prompt_tokens
        out.completion_tokens += reply.completion_tokens
        if reply.cost_usd is None:
            out.unpriced_calls += 1
        else:
            out.cost_usd += reply.cost_usd

    try:
        with condensing("condense" in variant):
            run_agent(tier, brief, toolbox, None, on_call, limits=Limits(max_turns=30))
    except MerlinError as exc:  # the model failed for good or ran out of turns
        out.failed[task.name] = f"{type(exc).__name__}: {exc}"[:200]
        return
    ended = Checkout.folder(repo).run_exit_command(EXIT_COMMAND, MerlinConfig(tiers=[tier]))
    if ended.ok:
        out.solved.append(task.name)
    else:
        out.failed[task.name] = ended.output_tail.strip().splitlines()[-1:][0][:200]


@contextlib.contextmanager
def condensing(on: bool) -> Iterator[None]:
    """Condensation as merlin has it, or switched off."""
    if on:
        yield
        return
    original = Condenser.fit
    Condenser.fit = lambda self, messages, force=False: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Condenser.fit = original  # type: ignore[method-assign]


def solve_rate(tier: Tier, tasks: tuple[Task, ...] = TASKS) -> list[Outcome]:
    """Every variant on every task, each run in a repository of its own."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="merlin-solve-") as folder:
        for variant in VARIANTS:
            out = Outcome(variant)
            for task in tasks:
                run_task(task, variant, tier, Path(folder), out)
            outcomes.append(out)
    return outcomes


def table(outcomes: list[Outcome], tasks: int) -> str:
    """The outcomes as a Markdown table, then why each unsolved task failed."""
    rows = [
        "| variant | solved | prompts with a map | prompt tokens | completion tokens | cost |",
        "|---|---|---|---|---|---|",
    ]
    for out in outcomes:
        name = " + ".join(out.variant) or "neither"
        cost = f"${out.cost_usd:.4f}" + (f" (+{out.unpriced_calls} unpriced calls)"
                                         if out.unpriced_calls else "")  # fmt: skip
        rows.append(
            f"| {name} | {len(out.solved)}/{tasks} ({len(out.solved) / tasks:.0%}) | "
            f"{out.mapped}/{tasks} | {out.prompt_tokens} | {out.completion_tokens} | {cost} |"
        )
    why = [f"- {' + '.join(o.variant) or 'neither'}, {name}: {reason}"
           for o in outcomes for name, reason in o.failed.items()]  # fmt: skip
    return "\n".join([*rows, *(["", "Not solved:", *why] if why else [])])


@contextlib.contextmanager
def oracle_endpoint() -> Iterator[str]:
    """``tests/model_server.py`` playing a model that knows each task's fix; its URL."""
    by_description = {task.description: task for task in TASKS}

    def respond(body: dict[str, Any]) -> Reply | None:
        messages = body.get("messages", [])
        if str(messages[0].get("content", "")).startswith("You condense"):
            return text("Summary: the module with the bug was read and fixed.")
        brief = next(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        task = next(t for d, t in by_description.items() if d in brief)
        done = sum(1 for m in messages if m.get("role") == "assistant")
        if done == 0:
            return tool_call("read_file", {"path": task.module}, "c0")
        if done == 1:
            content = {"path": task.module, "content": task.fixed}
            return tool_call("write_file", content, "c1")
        mapped = "with" if MAP_HEADING in brief else "without"
        return text(f"Fixed {task.module} ({mapped} a map in the first prompt).")

    # A window no request reaches: the server then reports its own count of each prompt.
    with ModelServer(respond=respond, window=10**9) as server:
        yield server.url


def run(endpoint: str, model: str, window: int | None, api_key_env: str | None) -> str:
    """The harness against ``endpoint`` (``oracle``: the test server); the report."""
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(oracle_endpoint()) if endpoint == "oracle" else endpoint
        tier = Tier(
            name="endpoint", model=f"openai/{model}", api_base=url, context_window=window,
            api_key_env=api_key_env, max_tokens=1024,
        )  # fmt: skip
        outcomes = solve_rate(tier)
    header = f"Endpoint {endpoint}, model {model}, {len(TASKS)} tasks, {len(VARIANTS)} variants:"
    report = f"{header}\n\n{table(outcomes, len(TASKS))}"
    if endpoint == "oracle":  # the harness checks itself: every task, a map exactly when asked
        wrong = [
            o.variant
            for o in outcomes
            if len(o.solved) != len(TASKS) or o.mapped != len(TASKS) * ("map" in o.variant)
        ]
        if wrong:
            raise SystemExit(f"the harness is broken: the oracle's variants {wrong}\n{report}")
    return report
