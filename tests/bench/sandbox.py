"""Benchmark: what the sandbox and the project's environment cost a step.

Run: ``python -m tests.bench.sandbox``. Measures, on this machine:

- one command (``true``, and ``python -c pass``) run directly (``[sandbox] mode =
  "none"``) and in bubblewrap, 30 times each: the sandbox's cost per command;
- the default Python environment of a small src-layout project (hatchling, a test extra
  with pytest and one more package) built with a cold uv cache, with a warm one, and
  found ready (what every attempt after the first pays).

Prints Markdown tables for docs/BENCHMARKS.md. ``--smoke``: 3 runs of each command, the
same three builds (a few seconds with uv's cache warm).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Environment, Sandbox, SandboxMode
from merlin_flow.workspace.environment import ensure_environment
from merlin_flow.workspace.sandbox import Confinement, python_mounts, run_confined

RUNS = 30
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "benchpkg"
version = "0.1"

[project.optional-dependencies]
test = ["pytest", "inflection"]
"""


def _times(argv: list[str], box: Confinement, config: Sandbox, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = run_confined(argv, box, config, 60)
        times.append(time.perf_counter() - started)
        assert result.ok, result.output_tail
    return times


def per_command(folder: Path, runs: int = RUNS) -> None:
    """Print the cost of one command, direct and sandboxed."""
    box = Confinement(
        worktree=folder, read_only=python_mounts(None), path=(str(Path(sys.executable).parent),)
    )
    print(f"| command | mode none (median of {runs}) | bwrap (median) | bwrap (slowest) |")
    print("|---|---|---|---|")
    for argv in (["true"], ["python", "-c", "pass"]):
        direct = _times(argv, box, Sandbox(mode=SandboxMode.NONE), runs)
        confined = _times(argv, box, Sandbox(), runs)
        print(
            f"| `{' '.join(argv)}` | {statistics.median(direct) * 1000:.1f} ms "
            f"| {statistics.median(confined) * 1000:.1f} ms | {max(confined) * 1000:.1f} ms |"
        )


def environment_build(folder: Path) -> None:
    """Print the time to build the default environment: cold, warm cache, ready."""
    repo = folder / "benchpkg"
    (repo / "src" / "benchpkg").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "src" / "benchpkg" / "__init__.py").write_text("VALUE = 1\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"],
        cwd=repo,
        check=True,
    )
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    config = MerlinConfig(tiers=[Tier(name="t", model="x/y")], environment=Environment())
    cache = folder / "uv-cache"
    rows = []
    for label, home in (("cold uv cache", "a"), ("warm uv cache", "b"), ("ready", "b")):
        settings = Settings(home=folder / home, uv_cache_dir=cache)
        started = time.perf_counter()
        built = ensure_environment(settings, config, repo, commit, "benchpkg")
        assert built is not None
        rows.append((label, time.perf_counter() - started, built.built))
    print("| environment | seconds | setup ran |")
    print("|---|---|---|")
    for label, seconds, ran in rows:
        print(f"| {label} | {seconds:.2f} | {'yes' if ran else 'no'} |")


def main() -> None:
    """Run both measurements in a temporary folder."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="3 runs of each command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="merlin-bench-sandbox-") as tmp:
        folder = Path(tmp)
        (folder / "worktree").mkdir()
        per_command(folder / "worktree", 3 if args.smoke else RUNS)
        print()
        environment_build(folder)


if __name__ == "__main__":
    main()
