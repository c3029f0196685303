"""Benchmark: planning a request on a repository of 2,000 files.

Run: ``python -m tests.bench.planning``. Builds a git repository of 2,000 Python files
with a long README, then plans one request that attaches a file with ``@path``, 5 times,
with a scripted planner (offline: the time is merlin's, not a model's). Prints the
context's size against ``[planning] context_tokens``, the planner's prompt tokens, and
the median and slowest time to read the context and to make the whole plan (the first
run includes litellm's import). ``--smoke``: 100 files, one run, a few seconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.planning.context import read_context
from merlin_flow.planning.planner import make_plan
from merlin_flow.workspace.git import head_commit

FILES = 2000
RUNS = 5
REQUEST = "Split @pkg/core.py into a parser and a renderer, and add tests for both"
ANSWER = (
    '{"steps": [{"id": "split", "step_type": "Refactor", "title": "Split core.py", '
    '"instruction": "Move parsing to parser.py and rendering to renderer.py"}, {"id": '
    '"tests", "step_type": "Test", "title": "Test both", "instruction": "Add tests", '
    '"depends_on": ["split"]}]}'
)


def build_repository(root: Path, files: int = FILES) -> Path:
    """A git repository of ``files`` files in nested packages, a README and a big core.py."""
    for n in range(files - 2):
        path = root / "pkg" / f"area_{n // 100:02d}" / f"module_{n:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Module {n}."""\n\nVALUE = {n}\n')
    (root / "pkg" / "core.py").write_text("def render(x):\n    return str(x)\n" * 2000)
    (root / "README.md").write_text("# Big\n\n" + "How the project works.\n" * 2000)
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    for args in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-qm", "big"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def main() -> None:
    """Print a Markdown table of the context's size and the planning times."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="100 files, one run")
    args = parser.parse_args()
    files, runs = (100, 1) if args.smoke else (FILES, RUNS)
    with tempfile.TemporaryDirectory(prefix="merlin-bench-") as folder:
        repo = build_repository(Path(folder) / "repo", files)
        script = Path(folder) / "planner.yaml"
        script.write_text(yaml.safe_dump({"rules": [{"reply": {"content": ANSWER}}]}))
        config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
        head = head_commit(repo)
        budget = config.planning.context_tokens
        read_times, plan_times, prompt_tokens, context_tokens = [], [], 0, 0
        for _ in range(runs):
            started = time.perf_counter()
            context = read_context(repo, head, ("pkg/core.py",), budget)
            read_times.append(time.perf_counter() - started)
            context_tokens = context.tokens
            started = time.perf_counter()
            plan = make_plan(REQUEST, config, lambda c: read_context(repo, head, c.files, budget))
            plan_times.append(time.perf_counter() - started)
            prompt_tokens = plan.prompt_tokens
        print(f"files in the commit: {context.tree_total}; shown in the tree: {len(context.tree)}")
        print(f"context: {context_tokens} tokens of a {budget}-token budget")
        print(f"planner prompt: {prompt_tokens} tokens; steps: {len(plan.steps)}\n")
        print(f"| what | median of {runs} | slowest |")
        print("|---|---|---|")
        for what, times in (("read the context", read_times), ("make the plan", plan_times)):
            print(
                f"| {what} | {statistics.median(times) * 1000:.0f} ms "
                f"| {max(times) * 1000:.0f} ms |"
            )


if __name__ == "__main__":
    main()
