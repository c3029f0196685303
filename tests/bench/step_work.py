"""What one step costs merlin in process: its git processes, its transactions, its time.

``python -m tests.bench.step_work`` (``--steps 10 --backend postgres``) runs a job of
``steps + 1`` steps the way a worker does, but with no Celery: ``execute_step`` then
``verify_step`` for each step, in this process, on a fresh database (a Postgres
database of its own, dropped after, or SQLite). The steps are those of
``tests.bench.overhead``: the scripted model answers at once and the exit command is
``true``, so what is timed is merlin's own work. The first step warms up (imports, the
command guard) and is not counted. It prints the time per step, every process the step
started (git, by subcommand) and every transaction, by the merlin function that began it,
and then what every step pays by design, apart from merlin's own logic (``floor``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SMOKE = {"steps": 1, "backend": "sqlite"}


@contextlib.contextmanager
def counted_processes() -> Iterator[collections.Counter[str]]:
    """Count every process started (git by its subcommand) while inside."""
    seen: collections.Counter[str] = collections.Counter()
    real = subprocess.Popen.__init__

    def counting(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [str(a) for a in (args if isinstance(args, list | tuple) else [args])]
        if Path(argv[0]).name == "git":
            # The subcommand: the first word that is not an option or an option's value.
            words = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
            seen[f"git {words[0] if words else '?'}"] += 1
        else:
            seen[Path(argv[0]).name] += 1
        real(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = counting  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        subprocess.Popen.__init__ = real  # type: ignore[method-assign]


def _beginner() -> str:
    """The innermost merlin function on the stack, and the one that called it."""
    frames = [f for f in traceback.extract_stack() if "/merlin_flow/" in f.filename][::-1][:2]
    return " < ".join(f"{Path(f.filename).stem}.{f.name}" for f in frames) or "?"


@contextlib.contextmanager
def database_url(backend: str, work: Path) -> Iterator[str | None]:
    """A Postgres database of the run's own (dropped after), or None for SQLite."""
    if backend == "sqlite":
        yield None
        return
    from tests.conftest import _postgres_database

    with contextlib.contextmanager(_postgres_database)() as url:
        yield url


def measure(steps: int, backend: str, work: Path, warm: bool = True) -> dict[str, Any]:
    """Run the job; the figures per counted step.

    ``warm``: load what a worker loads before it forks (``models.llm.preload``) first.
    """
    from sqlalchemy import event

    from merlin_flow.config import MerlinConfig, Tier
    from merlin_flow.engine.attempt import execute_step
    from merlin_flow.engine.verdict import verify_step
    from merlin_flow.jobs.submission import create_job
    from merlin_flow.models.llm import preload
    from merlin_flow.settings import Settings
    from merlin_flow.store import Database, open_database, upgrade
    from tests.bench.overhead import INSTANT, tasklist
    from tests.conftest import make_repo

    if warm:
        preload()
    with database_url(backend, work) as url:
        settings = Settings(home=work / "home", database_url=url)
        if url:
            schema = Database(settings.database)
            upgrade(schema)
            schema.dispose()
        db = open_database(settings.database)
        try:
            transactions: collections.Counter[str] = collections.Counter()
            event.listen(db.engine, "begin", lambda _conn: transactions.update([_beginner()]))
            script = work / "instant.yaml"
            script.write_text(INSTANT)
            config = MerlinConfig(tiers=[Tier(name="local", model=f"scripted/{script}")])
            repo = make_repo(work / "repo", {"README.md": "bench\n"})
            job = create_job(db, settings, tasklist(steps + 1), repo, config)
            execute_step(db, settings, job, "s0", "w:0a")
            verify_step(db, settings, job, "s0", "w:0b")
            transactions.clear()
            executing = verifying = 0.0
            with counted_processes() as processes:
                for n in range(1, steps + 1):
                    started = time.perf_counter()
                    execute_step(db, settings, job, f"s{n}", f"w:{n}a")
                    executed = time.perf_counter()
                    verify_step(db, settings, job, f"s{n}", f"w:{n}b")
                    executing += executed - started
                    verifying += time.perf_counter() - executed
        finally:
            db.dispose()
    return {
        "execute_ms": executing / steps * 1000,
        "verify_ms": verifying / steps * 1000,
        "processes": {name: count / steps for name, count in processes.most_common()},
        "transactions": {name: n / steps for name, n in transactions.most_common()},
    }


def floor(work: Path, runs: int = 10) -> dict[str, float]:
    """Medians, in ms, of what every step pays by design, apart from merlin's own logic.

    A worktree made and removed (a step makes two: the attempt's, verify's), the exit
    command ``true`` in the sandbox through the worker's command guard, and one call of
    the scripted model through litellm.
    """
    from merlin_flow.config import Tier
    from merlin_flow.models.llm import complete
    from merlin_flow.tool_config import Sandbox
    from merlin_flow.workspace.git import add_worktree, head_commit, remove_worktree
    from merlin_flow.workspace.sandbox import Confinement, python_mounts, run_confined

    repo = work / "repo"
    commit = head_commit(repo)
    tier = Tier(name="local", model=f"scripted/{work / 'instant.yaml'}")
    box = Confinement(worktree=repo, read_only=python_mounts(None), path=("/usr/bin",))
    times: dict[str, list[float]] = collections.defaultdict(list)
    for n in range(runs):
        started = time.perf_counter()
        remove_worktree(repo, add_worktree(repo, work / f"floor-{n}", commit))
        times["worktree"].append(time.perf_counter() - started)
        started = time.perf_counter()
        assert run_confined(["true"], box, Sandbox(), 60).ok
        times["sandboxed true"].append(time.perf_counter() - started)
        started = time.perf_counter()
        complete(tier, [{"role": "user", "content": "go"}], [])
        times["model call"].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1000 for name, values in times.items()}


def print_tables(figures: dict[str, Any], steps: int, backend: str) -> None:
    """The figures as Markdown tables."""
    total = figures["execute_ms"] + figures["verify_ms"]
    print(f"\n{backend}, {steps} steps after one to warm up; per step:\n")
    print("| execute_step | verify_step | both |\n|---|---|---|")
    print(f"| {figures['execute_ms']:.1f} ms | {figures['verify_ms']:.1f} ms | {total:.1f} ms |")
    floors = figures["floor"]
    least = 2 * floors["worktree"] + floors["sandboxed true"] + floors["model call"]
    print("\nWhat every step pays by design (median of 10 each):\n")
    print(
        "| two worktrees made and removed | `true` in the sandbox | one scripted model call |"
        " sum |\n|---|---|---|---|"
    )
    print(
        f"| {2 * floors['worktree']:.1f} ms | {floors['sandboxed true']:.1f} ms "
        f"| {floors['model call']:.1f} ms | {least:.1f} ms |"
    )
    processes = figures["processes"]
    print(f"\n{sum(processes.values()):g} processes per step:\n")
    print("| process | per step |\n|---|---|")
    for name, count in processes.items():
        print(f"| `{name}` | {count:g} |")
    transactions = figures["transactions"]
    print(f"\n{sum(transactions.values()):g} transactions per step, by who began them:\n")
    print("| begun in | per step |\n|---|---|")
    for name, count in transactions.items():
        print(f"| `{name}` | {count:g} |")


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--smoke", action="store_true", help="1 step on SQLite")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.backend = SMOKE["steps"], SMOKE["backend"]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    work = Path(tempfile.mkdtemp(prefix="merlin-step-work-"))
    os.environ["MERLIN_HOME"] = str(work / "home")
    try:
        figures = measure(args.steps, args.backend, work)
        figures["floor"] = floor(work)  # on the job's repository and scripted model
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_tables(figures, args.steps, args.backend)


if __name__ == "__main__":
    sys.exit(main())
