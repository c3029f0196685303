"""Benchmark: what a cascade saves. Always premium, always cheapest, merlin's routing.

Run: ``python -m tests.bench.cascade [--jobs 60] [--seed 2026]`` (about a minute;
``--smoke``: 3 jobs, always premium against merlin, then the learning phase at 6 + 6 jobs,
under a minute).

Learning mode: ``python -m tests.bench.cascade --learn [--seeds 5] [--jobs 120]
[--first-seed 2026]`` (``--smoke``: 6 + 6 jobs, one seed). Does routing that learns from
the journal (``[routing] learn``) start steps on cheaper tiers than the fixed rules? Jobs
share four repositories, one module per job; the first half teach, the second half are
measured, with descriptions the router has not seen (a held-out pool, which the rules
partly misjudge). Always premium, the fixed rules and the learner run on the same draws,
each on its own copies of the repositories; see ``tests.bench.cascade_learning``.

The workload is ``--jobs`` one-step Debug jobs, a third each easy, medium and hard. Each
job is its own git repository whose ``answer()`` returns 41; ``python check.py`` passes
when it returns 42. Harder jobs carry a longer ``app.py`` (20, 150 or 400 lines), which
the model reads, so they cost more tokens. Every tier of every job is a scripted model
that reads the file, then writes it back with 42 (it can solve the job) or with a wrong
number (it cannot, and its fix attempt fails too). Whether a tier can solve a job is
drawn once per job and tier from ``SUCCESS`` with a seeded RNG, and the same draws serve
all three strategies (common random numbers), so they differ only in what they do.

Each strategy runs every job through the real engine: ``create_job``, the Celery chain,
a real ``merlin worker`` process (prefork, 2 processes), real git worktrees and a real
exit command. Costs are the journal's (``llm_calls.cost_usd``) at ``PRICES``.

- always premium: one tier, premium;
- always cheapest: one tier, local, no escalation (one fix attempt, like the others);
- merlin: the three tiers, routed (complex steps start on fast, as in the shipped
  defaults), fix then escalate on a failed exit command; and the same with
  ``fix_attempts = 0`` (in this workload a fix never succeeds where its tier failed, so
  fixes are pure cost: the pessimistic case for merlin).

The worker is stopped, its whole process group, however the run ends (Ctrl-C and SIGTERM
too).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.processes import stop_group, terminated_as_exit, wait_until

DIFFICULTIES = ("easy", "medium", "hard")
TIERS = ("local", "fast", "premium")
SUCCESS = {  # probability that a tier can solve a job, per difficulty
    "local": {"easy": 0.90, "medium": 0.60, "hard": 0.20},
    "fast": {"easy": 0.95, "medium": 0.85, "hard": 0.50},
    "premium": {"easy": 0.98, "medium": 0.95, "hard": 0.85},
}
PRICES = {  # USD per million input / output tokens
    "local": (0.10, 0.30),
    "fast": (0.15, 0.60),
    "premium": (3.00, 15.00),
}
PADDING_LINES = {"easy": 20, "medium": 150, "hard": 400}
DESCRIPTIONS = {  # the router classifies these as simple, medium and complex
    "easy": "Fix the off-by-one in answer().",
    "medium": (
        "answer() in app.py returns 41 but its callers expect 42; find the cause and "
        "make check.py pass"
    ),
    "hard": (
        "answer() returns the wrong value under concurrent load across all callers; "
        "find the race and fix it without breaking check.py"
    ),
}
STRATEGIES = {  # tiers, [routing], fix attempts per tier
    "always premium": (["premium"], {}, 1),
    "always cheapest": (["local"], {}, 1),
    "merlin, no fix attempts": (list(TIERS), {"complex": "fast"}, 0),
    "merlin (routing + escalation)": (list(TIERS), {"complex": "fast"}, 1),
}
CHECK = "import app\n\nraise SystemExit(0 if app.answer() == 42 else 1)\n"


@dataclass(frozen=True)
class BenchJob:
    """One job of the workload: its difficulty and which tiers can solve it."""

    index: int
    difficulty: str
    solves: dict[str, bool]


def workload(jobs: int, seed: int) -> list[BenchJob]:
    """The seeded workload: difficulties in turn, one draw per job and tier."""
    rng = random.Random(seed)
    result = []
    for index in range(jobs):
        difficulty = DIFFICULTIES[index % len(DIFFICULTIES)]
        solves = {tier: rng.random() < SUCCESS[tier][difficulty] for tier in TIERS}
        result.append(BenchJob(index, difficulty, solves))
    return result


def app_source(difficulty: str, value: int) -> str:
    """``app.py``: padding the model must read, then ``answer()``."""
    padding = "".join(
        f"# {difficulty} context line {n:03d}: the module keeps its history here.\n"
        for n in range(PADDING_LINES[difficulty])
    )
    return f"{padding}\n\ndef answer():\n    return {value}\n"


def script(job: BenchJob, tier: str, path: str = "app.py") -> str:
    """The scripted model of ``tier`` on ``job``: right (42) or wrong (43, then 44).

    It reads and writes ``path``, the job's module.
    """
    import yaml

    def reply_rules(value: int) -> list[dict[str, Any]]:
        read = {"name": "read_file", "arguments": {"path": path}}
        content = app_source(job.difficulty, value)
        write = {"name": "write_file", "arguments": {"path": path, "content": content}}
        return [
            {"turn": 0, "reply": {"tool_calls": [read]}},
            {"turn": 1, "reply": {"tool_calls": [write]}},
            {"turn": 2, "reply": {"content": f"answer() returns {value}"}},
        ]

    if job.solves[tier]:
        rules = reply_rules(42)
    else:  # a fix attempt sees "repair them" in its prompt: another wrong number
        rules = [{"match": "repair them", **rule} for rule in reply_rules(44)] + reply_rules(43)
    return yaml.safe_dump({"rules": rules}, sort_keys=False)


def prepare(work: Path, jobs: list[BenchJob]) -> list[Path]:
    """One repository and one script per tier for each job."""
    from tests.conftest import make_repo

    repos = []
    for job in jobs:
        folder = work / f"job-{job.index:03d}"
        repos.append(
            make_repo(
                folder / "repo", {"app.py": app_source(job.difficulty, 41), "check.py": CHECK}
            )
        )
        for tier in TIERS:
            (folder / f"{tier}.yaml").write_text(script(job, tier))
    return repos


def config_for(work: Path, job: BenchJob, strategy: str) -> Any:
    """The MerlinConfig of ``job`` under ``strategy``."""
    names, routing, fixes = STRATEGIES[strategy]
    return tier_config(work / f"job-{job.index:03d}", names, routing, fixes)


def tier_config(scripts: Path, names: list[str], routing: dict[str, Any], fixes: int) -> Any:
    """Tiers ``names`` at ``PRICES``, each answering with ``scripts/<tier>.yaml``."""
    from merlin_flow.config import Limits, MerlinConfig, Routing, Tier

    tiers = [
        Tier(
            name=name,
            model=f"scripted/{scripts / f'{name}.yaml'}",
            price_in=PRICES[name][0],
            price_out=PRICES[name][1],
        )
        for name in names
    ]
    return MerlinConfig(tiers=tiers, routing=Routing(**routing), limits=Limits(fix_attempts=fixes))


def jobs_left(db: Any, ids: list[str]) -> int:
    """How many of the jobs ``ids`` have not finished."""
    from sqlalchemy import func, select

    from merlin_flow.store import Job

    with db.reader() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.id.in_(ids), Job.finished_at.is_(None))
            )
            or 0
        )


def run_strategy(
    strategy: str, work: Path, jobs: list[BenchJob], repos: list[Path], worker: Any, log: Path
) -> dict[str, Any]:
    """Submit every job under ``strategy``, wait for all of them, and sum the outcome."""
    from sqlalchemy import func, select

    from merlin_flow.jobs.submission import create_job
    from merlin_flow.planning.routing import Complexity, complexity_of
    from merlin_flow.settings import Settings
    from merlin_flow.store import Job, LlmCall, open_database
    from merlin_flow.tasklist import parse_tasklist
    from workers.canvas import enqueue_job

    settings = Settings(home=work / "home")  # the worker's (not this process's MERLIN_HOME)
    db = open_database(settings.database)
    ids: dict[str, BenchJob] = {}
    started = time.monotonic()
    for job, repo in zip(jobs, repos, strict=True):
        tasklist = parse_tasklist(
            {
                "title": f"{job.difficulty} job {job.index}",
                "steps": [
                    {
                        "id": "fix",
                        "step_type": "Debug",
                        "description": DESCRIPTIONS[job.difficulty],
                        "exit_command": "python check.py",
                    }
                ],
            }
        )
        expected = {"easy": Complexity.SIMPLE, "medium": Complexity.MEDIUM}
        assert complexity_of(tasklist.steps[0]) is expected.get(job.difficulty, Complexity.COMPLEX)
        job_id = create_job(db, settings, tasklist, repo, config_for(work, job, strategy))
        enqueue_job(db, job_id)
        ids[job_id] = job

    what = f"{len(ids)} jobs ({strategy}) to finish"
    wait_until(
        lambda: not jobs_left(db, list(ids)), what, [worker], [log],
        timeout=300 + 30 * len(ids), poll=0.5,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    with db.reader() as session:
        statuses = dict(
            session.execute(select(Job.id, Job.status).where(Job.id.in_(list(ids)))).all()
        )
        cost = session.scalar(
            select(func.coalesce(func.sum(LlmCall.cost_usd), 0.0)).where(
                LlmCall.job_id.in_(list(ids))
            )
        )
        calls = session.scalar(
            select(func.count()).select_from(LlmCall).where(LlmCall.job_id.in_(list(ids)))
        )
    db.dispose()
    by_difficulty = {
        d: statistics.mean(
            statuses[job_id] == "completed" for job_id, job in ids.items() if job.difficulty == d
        )
        for d in DIFFICULTIES
    }
    successes = sum(status == "completed" for status in statuses.values())
    return {
        "strategy": strategy,
        "jobs": len(ids),
        "successes": successes,
        "cost": float(cost or 0.0),
        "calls": int(calls or 0),
        "by_difficulty": by_difficulty,
        "seconds": elapsed,
    }


def main() -> None:
    """Run the strategies on one workload and print the Markdown table (or ``--learn``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", type=int, default=None, help="jobs in the workload (≥ 3; 60, with --learn 120)"
    )
    parser.add_argument("--seed", type=int, default=2026, help="seed of the success draws")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="3 jobs, premium against merlin, then a learning phase of 6 + 6 jobs "
        "(with --learn: 6 + 6 jobs, one seed)",
    )
    parser.add_argument("--learn", action="store_true", help="the learning phase (see above)")
    parser.add_argument("--seeds", type=int, default=5, help="with --learn: how many seeds")
    parser.add_argument("--first-seed", type=int, default=2026, help="with --learn: the first")
    args = parser.parse_args()
    strategies = list(STRATEGIES)
    learn_jobs = args.jobs or 120
    if args.smoke:
        learn_jobs, args.seeds = 12, 1
        strategies = [strategies[0], strategies[-1]]
        args.jobs = 3
    args.jobs = args.jobs or 60
    if args.learn and (learn_jobs < 2 or args.seeds < 1):
        parser.error("--learn needs --jobs ≥ 2 and --seeds ≥ 1")
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="merlin-cascade-") as tmp:
        work = Path(tmp)
        import tests.conftest  # noqa: F401  (it sets MERLIN_HOME on import: first, then ours)

        # Before merlin_flow reads its settings: a fresh home with its own database and broker.
        os.environ["MERLIN_HOME"] = str(work / "home")
        for name in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL"):
            os.environ.pop(name, None)
        from tests.e2e.helpers import merlin_env, start_worker
        from workers.app import app as celery_app

        celery_app.set_default()
        if not args.learn:
            jobs = workload(args.jobs, args.seed)
            repos = prepare(work, jobs)
        log = work / "worker.log"
        worker = start_worker(merlin_env(work / "home"), log, "--concurrency", "2")
        try:
            wait_until(
                lambda: "ready." in log.read_text(errors="replace"),
                "`merlin worker` to log 'ready.'",
                [worker],
                [log],
            )
            if not args.learn:
                rows = [run_strategy(name, work, jobs, repos, worker, log) for name in strategies]
                print_table(rows, args.jobs, args.seed)
            if args.learn or args.smoke:
                from tests.bench import cascade_learning

                if not args.learn:
                    print("\n## Learning phase (smoke)\n")
                seeds = range(args.first_seed, args.first_seed + args.seeds)
                cascade_learning.run(work, worker, log, learn_jobs, seeds)
        finally:
            stop_group(worker)


def print_table(rows: list[dict[str, Any]], jobs: int, seed: int) -> None:
    """The results as a Markdown table, and merlin against always-premium."""
    print(f"{jobs} jobs ({jobs // 3} easy, medium, hard each), seed {seed}\n")
    print(
        "| strategy | success | easy / medium / hard | total cost | cost per success "
        "| model calls | wall time |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        per = row["cost"] / row["successes"] if row["successes"] else float("nan")
        split = " / ".join(f"{row['by_difficulty'][d]:.0%}" for d in DIFFICULTIES)
        print(
            f"| {row['strategy']} | {row['successes']}/{row['jobs']} "
            f"({row['successes'] / row['jobs']:.0%}) | {split} | ${row['cost']:.4f} "
            f"| ${per:.5f} | {row['calls']} | {row['seconds']:.0f} s |"
        )
    premium, merlin = rows[0], rows[-1]
    print(
        f"\nmerlin: {merlin['successes']} successes against always-premium's "
        f"{premium['successes']}, at {merlin['cost'] / premium['cost']:.1%} of its cost"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
