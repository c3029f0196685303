"""The cascade benchmark's learning phase: does routing that learns beat the fixed rules?

Run: ``python -m tests.bench.cascade --learn [--seeds 5] [--jobs 120] [--first-seed 2026]``
(``--smoke``: 6 + 6 jobs, one seed). ``tests.bench.cascade``'s ``main`` starts the
worker and calls ``run``; this module has no ``main`` of its own.

The workload is ``--jobs`` one-step Debug jobs, easy, medium and hard in turn, with the
success draws of the plain benchmark (``tests.bench.cascade.workload``: the same seed
gives the same draws). The first half are the *learning* jobs, the second half the
*measured* ones. Job ``n`` goes to repository ``n % 4``, which holds one module per job
(``job_017.py``, padded by difficulty as ``app.py`` is) and a ``check.py`` that takes the
module's name: the exit command ``python check.py job_017`` passes when that module's
``answer()`` returns 42. Each job starts from the repository's HEAD on its own branch.

The descriptions come from two disjoint pools per difficulty, one for the learning jobs
and one held out for the measured ones, written as people write them and not to the
router's word lists: the rules misjudge some (the run prints how they classify them).

Strategies, each on its own copies of the four repositories (the journal is read per
repository path, so one strategy never teaches another), on one worker and database:

- always premium, on the measured jobs;
- fixed rules (three tiers, complex steps on fast, ``learn = false``), on the measured jobs;
- learned (``learn = true``): the learning jobs first, all finished, then the measured jobs;
- the oracle: each step names the cheapest tier its draws say solves it;
- start on local, start on fast, start on premium: each step names that tier and escalates
  from it. From them, per seed, ``HINDSIGHT``: the cheapest start tier of each
  difficulty, chosen after the fact, a floor for any router that cannot see the draws.

Only the measured jobs are counted. Per seed: a table, the tiers the measured steps started
on, how many the journal routed; then a summary over the seeds.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.cascade import (
    DIFFICULTIES,
    TIERS,
    BenchJob,
    app_source,
    jobs_left,
    script,
    tier_config,
)
from tests.bench.cascade import workload as draws
from tests.bench.processes import wait_until

REPOSITORIES = 4
CHECK = (
    "import importlib\nimport sys\n\n"
    "module = importlib.import_module(sys.argv[1])\n"
    "raise SystemExit(0 if module.answer() == 42 else 1)\n"
)
ORACLE = "oracle (knows each job's draws)"
"""The floor of any router: each step names the cheapest tier that solves it (premium if
none does), so no attempt fails but those no tier can pass."""
STRATEGIES: dict[str, tuple[list[str], dict[str, Any], bool]] = {  # tiers, [routing], learns
    "always premium": (["premium"], {"learn": False}, False),
    "fixed rules": (list(TIERS), {"complex": "fast", "learn": False}, False),
    "learned": (list(TIERS), {"complex": "fast", "learn": True}, True),
    ORACLE: (list(TIERS), {"complex": "fast", "learn": False}, False),
    **{f"start on {tier}": (list(TIERS), {"learn": False}, False) for tier in TIERS},
}
START = {f"start on {tier}": tier for tier in TIERS}
"""Strategies whose every step names the tier it starts on (and escalates from)."""
HINDSIGHT = "best start per difficulty, in hindsight"
"""Not run: per seed and difficulty, the cheapest of the ``START`` strategies that solved as
many jobs as the rules. It knows each job's difficulty and, looking back, which single
tier would have been cheapest for each difficulty on that seed's draws. A router sees
neither: the draws of a difficulty do not depend on a job's description. So, over seeds,
no router that does not know the draws can expect to spend less than this row."""
EVEN = 1e-9
"""USD: costs closer than this are equal (the same calls, summed in another order)."""


@dataclass(frozen=True)
class LearnJob(BenchJob):
    """A job of the learning workload: ``index`` is its number, from 1."""

    repository: int
    description: str
    measured: bool

    @property
    def module(self) -> str:
        """The job's module, without ``.py``."""
        return f"job_{self.index:03d}"


@dataclass
class Outcome:
    """What one strategy did with the measured jobs of one seed."""

    strategy: str
    jobs: int
    successes: int
    by_difficulty: dict[str, float]
    cost: float
    calls: int
    seconds: float
    starts: dict[str, Counter[str]]  # difficulty: the tiers the steps started on
    by_journal: int | None  # steps the journal routed (None: no ``steps.route`` column)
    cost_by_difficulty: dict[str, float]
    successes_by_difficulty: dict[str, int]


def workload(jobs: int, seed: int) -> list[LearnJob]:
    """The seeded workload: the plain benchmark's draws, repositories and descriptions."""
    wording = random.Random(f"descriptions {seed}")
    decks: dict[tuple[bool, str], list[str]] = {}
    result = []
    for drawn in draws(jobs, seed):
        number = drawn.index + 1
        measured = number > jobs // 2
        deck = decks.setdefault((measured, drawn.difficulty), [])
        if not deck:  # every description of the pool once, in a seeded order, then again
            pool = (HELD_OUT if measured else LEARNING)[drawn.difficulty]
            deck.extend(wording.sample(pool, len(pool)))
        description = deck.pop().format(module=f"job_{number:03d}.py")
        repository = number % REPOSITORIES
        result.append(
            LearnJob(number, drawn.difficulty, drawn.solves, repository, description, measured)
        )
    return result


def tasklist_of(job: LearnJob, oracle: bool = False, start: str | None = None) -> Any:
    """The job's one-step TaskList; the ``oracle``'s names the cheapest tier that solves it.

    ``start``: the tier the step names (it escalates from there).
    """
    from merlin_flow.tasklist import parse_tasklist

    step = {
        "id": "fix",
        "step_type": "Debug",
        "description": job.description,
        "exit_command": f"python check.py {job.module}",
    }
    if oracle:
        step["tier"] = next((tier for tier in TIERS if job.solves[tier]), TIERS[-1])
    elif start:
        step["tier"] = start
    return parse_tasklist({"title": f"{job.difficulty} job {job.index}", "steps": [step]})


def rules_on(descriptions: Iterable[tuple[str, str]]) -> str:
    """How the rules classify (difficulty, description) pairs, one clause per difficulty."""
    from merlin_flow.planning.routing import Complexity, score_words
    from merlin_flow.planning.routing import complexity_for as complexity
    from merlin_flow.tasklist import StepType

    seen: dict[str, Counter[str]] = {d: Counter() for d in DIFFICULTIES}
    for difficulty, text in descriptions:
        seen[difficulty][complexity(score_words(StepType.DEBUG, text)).value] += 1
    return "; ".join(
        f"{d} {sum(seen[d].values())}: "
        + ", ".join(f"{c.value} {seen[d][c.value]}" for c in Complexity if seen[d][c.value])
        for d in DIFFICULTIES
    )


def prepare(folder: Path, jobs: list[LearnJob]) -> Path:
    """One script per job and tier, in ``folder/scripts``; returns that folder."""
    scripts = folder / "scripts"
    for job in jobs:
        (scripts / job.module).mkdir(parents=True)
        for tier in TIERS:
            (scripts / job.module / f"{tier}.yaml").write_text(
                script(job, tier, f"{job.module}.py")
            )
    return scripts


def repositories(folder: Path, jobs: list[LearnJob]) -> list[Path]:
    """The four repositories, each with its jobs' modules and ``check.py``."""
    from tests.conftest import make_repo

    return [
        make_repo(
            folder / f"repo-{r}",
            {
                "check.py": CHECK,
                **{
                    f"{j.module}.py": app_source(j.difficulty, 41)
                    for j in jobs
                    if j.repository == r
                },
            },
        )
        for r in range(REPOSITORIES)
    ]


def config_for(scripts: Path, job: LearnJob, strategy: str) -> Any:
    """The MerlinConfig of ``job`` under ``strategy``."""
    names, routing, _ = STRATEGIES[strategy]
    return tier_config(scripts / job.module, names, routing, 1)


class Runner:
    """Submits a strategy's jobs to the one worker and database of the whole run."""

    def __init__(self, work: Path, worker: subprocess.Popen[bytes], log: Path) -> None:
        from merlin_flow.settings import Settings
        from merlin_flow.store import open_database

        self.settings = Settings(home=work / "home")  # the worker's
        self.db = open_database(self.settings.database)
        self.worker, self.log = worker, log

    def submit(
        self, jobs: list[LearnJob], repos: list[Path], scripts: Path, strategy: str
    ) -> dict[str, tuple[LearnJob, str, str | None]]:
        """Create and queue ``jobs``: per job id, the job, its first tier and who chose it."""
        from sqlalchemy import select

        from merlin_flow.jobs.submission import create_job
        from merlin_flow.store import Step
        from workers.canvas import enqueue_job

        ids = {}
        for job in jobs:
            config = config_for(scripts, job, strategy)
            ids[
                create_job(
                    self.db,
                    self.settings,
                    tasklist_of(job, oracle=strategy == ORACLE, start=START.get(strategy)),
                    repos[job.repository],
                    config,
                )
            ] = job
        route = getattr(Step, "route", None)  # the routing decision, once that column exists
        columns = [Step.job_id, Step.tier_index, *([route] if route is not None else [])]
        with self.db.reader() as session:
            rows = session.execute(select(*columns).where(Step.job_id.in_(list(ids)))).all()
        names = STRATEGIES[strategy][0]
        started = {
            row[0]: (names[row[1]], (row[2] or {}).get("by") if len(row) > 2 else None)
            for row in rows
        }
        for job_id in ids:
            enqueue_job(self.db, job_id)
        return {job_id: (job, *started[job_id]) for job_id, job in ids.items()}

    def wait(self, ids: list[str], what: str) -> None:
        """Until every job of ``ids`` has finished."""

        def finished() -> bool:
            return not jobs_left(self.db, ids)

        timeout = 300 + 30 * len(ids)
        wait_until(finished, what, [self.worker], [self.log], timeout=timeout, poll=0.5)

    def run(self, strategy: str, jobs: list[LearnJob], repos: list[Path], scripts: Path) -> Outcome:
        """The strategy's learning jobs (if it learns), then its measured jobs, counted."""
        from sqlalchemy import func, select

        from merlin_flow.store import Job, LlmCall

        if STRATEGIES[strategy][2]:
            learning = self.submit([j for j in jobs if not j.measured], repos, scripts, strategy)
            self.wait(list(learning), f"{len(learning)} learning jobs ({strategy}) to finish")
        started = time.monotonic()
        measured = self.submit([j for j in jobs if j.measured], repos, scripts, strategy)
        ids = list(measured)
        self.wait(ids, f"{len(ids)} measured jobs ({strategy}) to finish")
        seconds = time.monotonic() - started
        with self.db.reader() as session:
            statuses = dict(
                session.execute(select(Job.id, Job.status).where(Job.id.in_(ids))).all()
            )
            cost = session.scalar(
                select(func.coalesce(func.sum(LlmCall.cost_usd), 0.0)).where(
                    LlmCall.job_id.in_(ids)
                )
            )
            calls = session.scalar(
                select(func.count()).select_from(LlmCall).where(LlmCall.job_id.in_(ids))
            )
            per_job = dict(
                session.execute(
                    select(LlmCall.job_id, func.coalesce(func.sum(LlmCall.cost_usd), 0.0))
                    .where(LlmCall.job_id.in_(ids))
                    .group_by(LlmCall.job_id)
                ).all()
            )
        starts: dict[str, Counter[str]] = {d: Counter() for d in DIFFICULTIES}
        for job, tier, _ in measured.values():
            starts[job.difficulty][tier] += 1
        bys = [by for _, _, by in measured.values()]
        return Outcome(
            strategy=strategy,
            jobs=len(ids),
            successes=sum(status == "completed" for status in statuses.values()),
            by_difficulty={
                d: statistics.mean(
                    statuses[i] == "completed"
                    for i, (j, _, _) in measured.items()
                    if j.difficulty == d
                )
                for d in DIFFICULTIES
                if any(j.difficulty == d for j, _, _ in measured.values())
            },
            cost=float(cost or 0.0),
            calls=int(calls or 0),
            seconds=seconds,
            starts=starts,
            by_journal=None if all(by is None for by in bys) else bys.count("journal"),
            cost_by_difficulty={
                d: sum(
                    float(per_job.get(i) or 0.0)
                    for i, (j, _, _) in measured.items()
                    if j.difficulty == d
                )
                for d in DIFFICULTIES
            },
            successes_by_difficulty={
                d: sum(
                    statuses[i] == "completed"
                    for i, (j, _, _) in measured.items()
                    if j.difficulty == d
                )
                for d in DIFFICULTIES
            },
        )


def run(
    work: Path, worker: subprocess.Popen[bytes], log: Path, jobs: int, seeds: Iterable[int]
) -> None:
    """Every strategy on every seed's workload; prints each seed's table, then the summary."""
    runner = Runner(work, worker, log)
    learning = [(d, t.format(module="job_001.py")) for d in DIFFICULTIES for t in LEARNING[d]]
    held = [(d, t.format(module="job_001.py")) for d in DIFFICULTIES for t in HELD_OUT[d]]
    print(f"Rules on the learning pool: {rules_on(learning)}")
    print(f"Rules on the held-out pool: {rules_on(held)}\n")
    results: dict[int, list[Outcome]] = {}
    try:
        for seed in seeds:
            folder = work / f"seed-{seed}"
            jobs_ = workload(jobs, seed)
            scripts = prepare(folder, jobs_)
            results[seed] = [
                runner.run(strategy, jobs_, repositories(folder / f"strategy-{k}", jobs_), scripts)
                for k, strategy in enumerate(STRATEGIES)
            ]
            print_seed(seed, jobs_, results[seed])
    finally:
        runner.db.dispose()
    print_summary(results)


def hindsight(rows: list[Outcome]) -> tuple[float, int]:
    """One seed's ``HINDSIGHT`` row: its cost and successes.

    Per difficulty, the cheapest ``START`` strategy among those that solved at least as
    many jobs of it as the fixed rules (``rows[1]``).
    """
    starts = [row for row in rows if row.strategy in START]
    cost, successes = 0.0, 0
    for d in DIFFICULTIES:
        enough = [
            row
            for row in starts
            if row.successes_by_difficulty[d] >= rows[1].successes_by_difficulty[d]
        ] or starts
        best = min(enough, key=lambda row: row.cost_by_difficulty[d])
        cost += best.cost_by_difficulty[d]
        successes += best.successes_by_difficulty[d]
    return cost, successes


def not_worse(learned: Outcome, rules: Outcome) -> bool:
    """Learned cost at most the rules' (within ``EVEN``)."""
    return learned.cost <= rules.cost + EVEN


def starts_line(starts: dict[str, Counter[str]]) -> str:
    """``easy: local 7; medium: ...``: the tiers steps started on, by difficulty."""
    return "; ".join(
        f"{d}: " + ", ".join(f"{t} {starts[d][t]}" for t in TIERS if starts[d][t])
        for d in DIFFICULTIES
        if starts[d]
    )


def print_seed(seed: int, jobs: list[LearnJob], rows: list[Outcome]) -> None:
    """One seed: the Markdown table, the rules on its descriptions, where steps started."""
    measured = [j for j in jobs if j.measured]
    print(f"### Seed {seed}: {len(jobs) - len(measured)} learning jobs, {len(measured)} measured\n")
    print(
        "| strategy | success | easy / medium / hard | total cost | cost per success "
        "| model calls | wall time (measured) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        per = f"${row.cost / row.successes:.5f}" if row.successes else "-"
        split = " / ".join(
            f"{row.by_difficulty[d]:.0%}" for d in DIFFICULTIES if d in row.by_difficulty
        )
        print(
            f"| {row.strategy} | {row.successes}/{row.jobs} ({row.successes / row.jobs:.0%}) "
            f"| {split} | ${row.cost:.4f} | {per} | {row.calls} | {row.seconds:.0f} s |"
        )
    rules, learned = rows[1], rows[2]
    said = rules_on((j.difficulty, j.description) for j in measured)
    print(f"\nRules on the measured descriptions: {said}")
    print(f"Measured steps started on, fixed rules: {starts_line(rules.starts)}")
    print(f"Measured steps started on, learned: {starts_line(learned.starts)}")
    if learned.by_journal is not None:
        print(f"Learned: the journal routed {learned.by_journal} of {learned.jobs} measured steps")
    cost, successes = hindsight(rows)
    print(f"{HINDSIGHT}: ${cost:.4f}, {successes}/{rules.jobs} solved")
    verdict = "not worse" if not_worse(learned, rules) else "WORSE"
    print(f"Learned against rules: ${learned.cost:.4f} against ${rules.cost:.4f}, {verdict}\n")
    sys.stdout.flush()


def print_summary(results: dict[int, list[Outcome]]) -> None:
    """Over the seeds: cost against always premium, success, learned against rules."""
    seeds = list(results)
    print(f"### Summary over {len(seeds)} seed{'s' * (len(seeds) > 1)} ({seeds[0]}..{seeds[-1]})\n")
    print("| strategy | success | mean cost, % of always premium | measured steps started on |")
    print("|---|---|---|---|")
    for k, strategy in enumerate(STRATEGIES):
        outcomes = [rows[k] for rows in results.values()]
        successes, jobs = sum(o.successes for o in outcomes), sum(o.jobs for o in outcomes)
        ratios = [rows[k].cost / rows[0].cost for rows in results.values() if rows[0].cost]
        share = f"{statistics.mean(ratios):.1%}" if ratios else "-"
        starts: dict[str, Counter[str]] = {d: Counter() for d in DIFFICULTIES}
        for outcome in outcomes:
            for d in DIFFICULTIES:
                starts[d].update(outcome.starts[d])
        print(
            f"| {strategy} | {successes}/{jobs} ({successes / jobs:.0%}) | {share} "
            f"| {starts_line(starts) if k else '-'} |"
        )
    shares, solved, jobs = [], 0, sum(rows[0].jobs for rows in results.values())
    for rows in results.values():
        cost, successes = hindsight(rows)
        solved += successes
        shares.append(cost / rows[0].cost if rows[0].cost else 0.0)
    print(
        f"| {HINDSIGHT} | {solved}/{jobs} ({solved / jobs:.0%}) "
        f"| {statistics.mean(shares):.1%} | - |"
    )
    never_worse = [not_worse(rows[2], rows[1]) for rows in results.values()]
    each = ", ".join(
        f"{s} {'yes' if ok else 'NO'}" for s, ok in zip(seeds, never_worse, strict=True)
    )
    print(
        f"\nLearned cost <= rules cost on the same draws: {sum(never_worse)} of "
        f"{len(seeds)} seeds ({each})"
    )
    sys.stdout.flush()


# The descriptions: ``{module}`` is the job's module (``job_017.py``).
LEARNING = {
    "easy": (
        "{module}: answer() is off by one, it should be 42.",
        "A user filed this: 'When I run the check script against {module} it exits with "
        "status 1. I looked at answer() and it returns 41, while everything else in the "
        "project, the docs and the examples in the tutorial included, assumes 42. I am not "
        "sure whether 41 was intentional, but I could not find any reason for it.' Please "
        "look into it and fix answer() if it is indeed wrong.",
        "answer() in {module} returns 41; the spec says 42.",
        "Small bug in {module}: answer() comes out one too low.",
        "The check fails because {module} returns the wrong number. Please fix.",
        "Correct answer() in {module} so check.py passes.",
        "Quick fix: answer() in {module} gives 41 instead of 42.",
        "Tiny one, but it's blocking the release: answer() in {module} returns 41 and "
        "check.py wants 42. Please change the return value and double-check that nothing "
        "else in the module reads the old number.",
        "answer() in {module} returns a stale hard-coded value; bump it to the right one.",
        "The check for {module} is red: answer() is wrong by one.",
        "answer() in {module} returns 41 but should return 42; check.py and the examples in "
        "docs/usage.md and README.md all agree on 42, so only the module is wrong.",
        "There's an off-by-one in {module}. Fix answer().",
    ),
    "medium": (
        "answer() in {module} returns 41 but its callers expect 42. Find out where the value "
        "goes wrong and fix it, keeping check.py passing for the other modules.",
        "Since the last refactor, {module} no longer produces the expected result from "
        "answer(). Trace the computation, find the step that loses one, and correct it "
        "without changing the function's signature.",
        "The check for {module} started failing after we changed how defaults are loaded. "
        "Investigate why answer() returns the old value and fix it so it returns 42 again.",
        "answer() in {module} is supposed to return the configured answer, but the result is "
        "one short. Look at how the result is assembled and fix the bug; leave a short note "
        "in the code explaining the cause.",
        "answer() in {module} disagrees with check.py since the constants moved from "
        "settings.py to defaults.py; find what the module still reads and fix it.",
        "Debug {module}: answer() returns an incorrect result, probably due to an "
        "initialisation issue in the module-level code. Fix it so the check passes and the "
        "module still imports cleanly.",
        "After merging the settings change, the value returned by answer() in {module} is "
        "off. Work out whether the bug is in the module or in the check's expectation (it is "
        "the module) and fix it.",
        "Our nightly check flagged {module}: answer() returns the previous release's value. "
        "Find where it is hard-coded or cached and make it return the current value, 42.",
        "Investigate the stale value coming out of answer() in {module}.",
        "The function answer() in {module} computes its result incorrectly; the expected "
        "value is 42. Read through the module, identify the faulty expression and fix it with "
        "a minimal change.",
        "answer() in {module} is wrong since the last merge. Debug it.",
        "There is a logic error in {module} that makes answer() one lower than expected. "
        "Locate it, fix it, and keep the rest of the module's behaviour unchanged.",
    ),
    "hard": (
        "answer() in {module} intermittently returns 41 instead of 42 when the job runner "
        "calls it from several threads at once. The value is assembled from a cache in "
        "cache/store.py and defaults loaded by settings/loader.py, and I suspect the module "
        "reads the cache before the loader has finished. Find the ordering problem and fix it "
        "in {module} so the result is stable; check.py must pass every time.",
        "We have a flaky failure in CI: check.py fails on {module} roughly one run in five and "
        "nobody can reproduce it locally. answer() depends on state initialised in "
        "worker/pool.py and shared with scheduler.py, and the failures started after we moved "
        "to a process pool. Find out why answer() sometimes sees the old value and fix it.",
        "After splitting the monolith into api/handlers.py, core/answers.py and {module}, "
        "answer() returns the pre-split value. The logic was moved but one of the adjustments "
        "was lost along the way. Trace how the value used to be computed, compare it with "
        "what {module} does now, and restore the correct result without re-merging modules.",
        "Under load the service returns 41 from answer() in {module}, while single requests "
        "get 42. The module keeps a lazily initialised value that two requests can initialise "
        "at the same time, and the second one overwrites the first with a stale number. Fix "
        "the initialisation so it holds up with concurrent callers (server/app.py and "
        "middleware/timing.py are where the requests come in), and keep check.py passing.",
        "answer() in {module} is wrong only when the module is imported through "
        "plugins/registry.py rather than directly: the registry reloads modules and a "
        "module-level counter ends up one short. Untangle the reload in plugins/registry.py, "
        "the hooks in plugins/hooks.py and the state kept in {module}, and fix {module} so it "
        "returns 42 however it is loaded.",
        "Intermittent wrong answer: {module} sometimes returns 41. It reads a value written by "
        "a background task in tasks/refresh.py, with no lock or event between the writer and "
        "the reader. Work out the interleaving, decide where the synchronisation belongs, and "
        "make answer() always return 42. Don't change the timing in tasks/refresh.py; "
        "tests/test_refresh.py relies on it.",
        "Moving our config format from INI to TOML broke answer() in {module}: it now returns "
        "41. The value flows through config/parse.py, config/schema.py and a compatibility "
        "shim in legacy/compat.py before it reaches the module. Find where the off-by-one "
        "creeps in, fix it in the right place for {module}, and keep check.py green.",
        "Since we enabled the async event loop in runtime/loop.py, answer() in {module} "
        "returns stale data about half the time. The module caches its result on the first "
        "call, but that call now happens before runtime/bootstrap.py has set the value. Fix "
        "the caching in {module} so the result is right whenever it is first called.",
        "Flaky under threads: answer() in {module} sometimes returns 41.",
        "check.py fails for {module} only when the whole suite runs, never when the check runs "
        "alone. Some other module mutates shared state that {module} relies on; the suspects "
        "are state/globals.py, state/session.py and fixtures/setup.py. Identify the leak, "
        "make {module} independent of it, and get the check passing both ways.",
        "answer() in {module} is wrong only in the forked workers. Fix it.",
        "Intermittent wrong result from {module} in production that nobody can reproduce "
        "locally; please investigate and fix answer().",
    ),
}
HELD_OUT = {
    "easy": (
        "answer() in {module} should return 42, not 41.",
        "Fix the failing check for {module}; the returned number is off.",
        "{module} has a trivial bug in answer(). Fix it.",
        "Reported by QA: in {module}, answer() hands back 41. Every caller, the fixture data "
        "and the release notes say it should be 42. Looks like a plain off-by-one from the "
        "last time the constant was edited; please correct it and run the check.",
        "Please repair answer() in {module}, it returns the wrong integer.",
        "check.py fails on {module}: wrong return value. Should be a one-line fix.",
        "Off-by-one in the return value of answer(), file {module}.",
        "While reviewing {module} I noticed answer() returns 41. The design note in "
        "docs/answers.md, the fixture in tests/data/expected.json and check.py all expect "
        "42. Nothing else seems to depend on 41, so it should be a one-line change to the "
        "return value.",
        "answer() from {module} returns 41. Expected 42.",
        "Someone typed 41 instead of 42 in {module}; correct it.",
        "Regression in {module}: answer() lost one somewhere. Restore the right value.",
        "The number answer() in {module} gives back is wrong: it's 41 and has to be 42 for "
        "check.py to pass, which blocks the nightly build. Please fix it today if possible.",
    ),
    "medium": (
        "answer() in {module} stopped returning 42 after last week's cleanup. Figure out which "
        "change broke it and put the correct behaviour back, keeping the function as it is.",
        "Running python check.py against {module} fails. answer() appears to return a stale "
        "value; find where it comes from and fix the module.",
        "We get 41 from answer() in {module} on every call, and the expected result is 42. "
        "Please find the root cause rather than just patching the number, and fix it.",
        "Fix the incorrect result of answer() in {module}. The module has a lot of history "
        "notes at the top; the actual logic is at the bottom. Verify with check.py.",
        "Find out why {module} returns the old answer and fix it.",
        "answer() in {module} looks right at first glance but the check disagrees. Work "
        "through it carefully and fix whatever makes it return one less than expected.",
        "The expected output of answer() in {module} is 42 according to check.py. It "
        "currently returns something else. Find the bug and fix it with a focused change.",
        "Since config.py and constants.py were merged, answer() in {module} comes out one "
        "short; check.py shows it. Find the lost adjustment and fix the module.",
        "Debug the failing check for {module}: the function returns an off-by-one result, "
        "possibly from an earlier edit to the constants. Fix it in place.",
        "After the upgrade, {module} produces a different value from answer() than before. "
        "Restore the old, correct value of 42 and make sure nothing else in the module changes.",
        "check.py fails for {module}; answer() is computed wrongly. Investigate.",
        "Investigate {module}: answer() should return 42 but returns 41 in our environment. "
        "Find the faulty line and fix it without touching check.py.",
    ),
    "hard": (
        "Every few hundred requests answer() in {module} returns 41. The module memoises its "
        "result in a dict shared by the request threads started in web/server.py, and the "
        "memo is written in two steps. Find the window in which a reader sees a half-written "
        "entry, close it, and confirm with check.py that the module returns 42.",
        "We upgraded the task queue and now answer() in {module} is wrong on some workers and "
        "right on others. The workers import the module through queue/consumer.py, which "
        "preloads shared/state.py in the parent before forking. Investigate why the forked "
        "workers see a stale value and fix {module} so all of them return 42.",
        "Since the refactor that moved value resolution out of core/resolve.py into {module}, "
        "answer() is off by one. The old code applied a correction in core/adjust.py that the "
        "new module never calls. Trace both paths, decide where the correction belongs now, "
        "and fix {module} so it returns 42.",
        "Flaky: check.py passes locally and fails on the build machine about a third of the "
        "time for {module}. The build runs checks in parallel, and {module} reads a temporary "
        "file that tools/prepare.py writes and tools/cleanup.py deletes. Figure out the "
        "interleaving that produces 41 and make {module} robust to it.",
        "answer() in {module} must return 42 but returns 41 when called through the public "
        "API in api/v2/routes.py, while the internal path through services/answers.py is "
        "fine. The two paths initialise the module differently. Find the difference, make the "
        "initialisation consistent, and fix the bug in {module}.",
        "A deadlock fix last month introduced a wrong result: {module} now releases its lock "
        "before updating the value, so readers in reports/daily.py and reports/weekly.py can "
        "observe the old number, 41. Rework the locking in {module} so readers always see 42 "
        "and the deadlock does not come back.",
        "The value of answer() in {module} depends on import order: importing "
        "metrics/export.py first gives 41, importing {module} first gives 42. A circular "
        "import between {module}, metrics/export.py and metrics/registry.py leaves a partly "
        "initialised module behind. Break the cycle or make answer() independent of it.",
        "Heisenbug in {module}: answer() is 41 only when run under the profiler.",
        "Nondeterministic answer() in {module}: about half the CI runs get 41.",
        "After switching the database driver, answer() in {module} occasionally returns the "
        "previous value. The module reads from a connection pool in db/pool.py whose "
        "connections are shared between threads, and a transaction opened in db/session.py is "
        "not committed before the read. Track down the ordering issue and fix {module}.",
        "answer() in {module} returns 41 on some workers since the queue upgrade. Fix.",
        "Our property-based tests in tests/test_answers.py find rare inputs where the pipeline "
        "produces 41; shrinking points at {module}. The pipeline runs pipeline/stage_a.py and "
        "pipeline/stage_b.py in parallel and merges their results in {module}. Find the merge "
        "bug that loses one and fix it.",
    ),
}
