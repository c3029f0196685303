"""Benchmark: the repository map (merlin_flow.workspace.repo_map) on real repositories.

Run: ``python -m tests.bench.repo_map --repo PATH [--tasks-from PATH ...]`` (a few
minutes; PATH a git clone, e.g. of sympy, 2,087 files), or ``--smoke`` (seconds: this
repository, no network). It writes its section of docs/BENCHMARKS.md (``--no-docs``
to leave the file alone; ``--smoke`` never writes it).

Timings, on a local clone of ``--repo`` (so the change below touches no one's files),
each build a fresh ``build_map`` call in this process (modules imported):

- **cold**: an empty cache folder, every file tagged (target 5 s for 2,000 files);
- **warm**: nothing changed since (target 0.5 s);
- **incremental**: one source file changed in the worktree, a new function appended
  (target 0.3 s; exactly one file tagged).

Budgets: maps of budgets from 0 to 32,000 tokens, counted by the project's estimate
and by a stricter counter (one token per word or punctuation mark): the largest
``tokens - budget`` must be at most 0.

Hit rate: held-in tasks made from each ``--tasks-from`` repository's history: a commit
that changed exactly one non-test source file the map reads (and otherwise only tests
or non-code files) is a task; its message, with every file name taken out, is the
description; the file is the one to edit. The map is built at the commit's parent
(``commit=``, from the object store) focused on the description alone; a hit is the
file among the map's first 10 files. Target: 70%.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merlin_flow.workspace.repo_grammars import is_test, kind_of
from merlin_flow.workspace.repo_map import build_map, estimate_tokens
from tests.bench.docs_section import write_section

ROOT = Path(__file__).resolve().parents[2]
SECTION_INTRO = """On clones of each repository (made with the search tool's `fetch`):

```sh
python -m tests.bench.repo_map --repo sympy \\
    --tasks-from flask requests click sympy gin cobra express ky ripgrep \\
    --held-out jinja httpx mux axios
```

On the shared 2-core machine, while other work ran on it: the cold build's CPU seconds
(this process and its spawned taggers) are the figure that does not depend on that
load. Timings are medians of 5 (cold: of 2) `build_map` calls in one process; the
incremental build follows a new function appended to one source file. Hit rate:
held-in tasks (the repositories the focus weights were tuned on) and held-out ones
(never looked at while tuning): a commit that changed one non-test source file, its
message without file names as the step's words, the map built at its parent; a hit is
the file among the map's first 10. The weights are in
`merlin_flow/workspace/repo_focus.py` and `repo_rank.py`."""
DOCS = ROOT / "docs" / "BENCHMARKS.md"
HEADING = "## Repository map"
TOP = 10
CODE_ENDINGS = re.compile(
    r"\.(py|pyx|pxd|pyi|js|jsx|mjs|cjs|ts|tsx|go|rs|c|h|cc|cpp|hpp|java|kt|rb|php|sh|"
    r"html|css|scss|vue|svelte|swift|m|mm|cs|scala|lua|pl|sql)$"
)
FILE_NAME = re.compile(r"\S*[/\\]\S*|\S+\.[A-Za-z]{1,5}\b|`[^`\s]+\.[A-Za-z]{1,5}`")
DULL = re.compile(r"^(bump|release|version|merge|revert|prepare|changelog|v?\d+\.\d+)", re.I)


@dataclass(frozen=True)
class Task:
    """A commit whose one changed source file is the file to edit."""

    repo: Path
    commit: str
    parent: str
    target: str
    description: str


@dataclass(frozen=True)
class Outcome:
    task: Task
    position: int
    """Where the target is in the map's ranking (from 1); 0 when it is absent."""
    seconds: float


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def describe(message: str, target: str) -> str:
    """The commit message without file names (paths, ``name.ext``, the target's name)."""
    lines = [line for line in message.splitlines() if not re.match(r"^\S+-by:", line)]
    text = FILE_NAME.sub(" ", "\n".join(lines))
    text = re.sub(re.escape(target.rsplit("/", 1)[-1]), " ", text)
    return re.sub(r"[ \t]+", " ", text).strip()


def tasks_of(repo: Path, limit: int, scan: int = 3000) -> list[Task]:
    """The most recent ``limit`` tasks of ``repo`` among its last ``scan`` commits."""
    log = git(
        repo, "log", "--no-merges", f"-n{scan}", "--name-status", "--format=%x1e%H %P%x1f%B%x1f"
    )
    found = []
    for record in log.split("\x1e")[1:]:
        head, message, changes = ([*record.split("\x1f"), "", ""])[:3]
        commit, *parents = head.split()
        if len(parents) != 1 or DULL.match(message.strip()):
            continue
        sources, others = [], []
        for line in changes.strip().splitlines():
            status, *paths = line.split("\t")
            path = paths[-1]
            kind = kind_of(path)
            if kind is not None and not is_test(path) and "/." not in "/" + path:
                sources.append((status, path))
            elif CODE_ENDINGS.search(path) and not is_test(path):
                others.append(path)
        if len(sources) != 1 or others or sources[0][0] != "M":
            continue
        target = sources[0][1]
        description = describe(message, target)
        if len(re.findall(r"[A-Za-z]{2,}", description)) < 4:
            continue
        found.append(Task(repo, commit, parents[0], target, description))
        if len(found) == limit:
            break
    return found


def hit_rate(tasks: list[Task], cache: Path, budget: int) -> list[Outcome]:
    outcomes = []
    for task in tasks:
        started = time.perf_counter()
        found = build_map(
            task.repo,
            budget_tokens=budget,
            focus_words=[task.description],
            cache_dir=cache,
            commit=task.parent,
        )
        files = list(found.files)
        position = files.index(task.target) + 1 if task.target in files else 0
        outcomes.append(Outcome(task, position, time.perf_counter() - started))
    return outcomes


def word_count(text: str) -> int:
    """A stricter counter than 4 characters a token: each word and each mark counts."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def timed(call: Callable[[], object], cpu: list[float] | None = None) -> float:
    started, used = time.perf_counter(), cpu_seconds()
    call()
    if cpu is not None:
        cpu.append(cpu_seconds() - used)
    return time.perf_counter() - started


def timings(repo: Path, work: Path, rounds: int, budget: int) -> dict[str, object]:
    load = os.getloadavg()[0]
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(repo), str(clone)], check=True)
    cache = work / "cache"
    focus = ["the printer of integrals prints the limits in the wrong order"]

    def build() -> object:
        return build_map(clone, budget_tokens=budget, focus_words=focus, cache_dir=cache)

    cold_maps = []
    cold, cold_cpu = [], []
    for _round in range(max(1, rounds // 2)):
        shutil.rmtree(cache, ignore_errors=True)
        started, cpu = time.perf_counter(), cpu_seconds()
        cold_maps.append(build())
        cold.append(time.perf_counter() - started)
        cold_cpu.append(cpu_seconds() - cpu)
    first = cold_maps[-1]
    assert hasattr(first, "stats")
    warm_cpu: list[float] = []
    warm = [timed(build, warm_cpu) for _round in range(rounds)]
    ranked = [p for p in first.files if not is_test(p)]  # type: ignore[attr-defined]
    changed = clone / ranked[len(ranked) // 2]
    incremental, incremental_cpu, parsed = [], [], []
    for n in range(rounds):
        with changed.open("a") as out:
            out.write(_new_function(changed.suffix, n))
        started, used = time.perf_counter(), cpu_seconds()
        after = build_map(clone, budget_tokens=budget, focus_words=focus, cache_dir=cache)
        incremental.append(time.perf_counter() - started)
        incremental_cpu.append(cpu_seconds() - used)
        parsed.append(after.stats.parsed)
    overshoot = -(10**9)
    for counter in (estimate_tokens, word_count):
        for size in (0, 1, 5, 50, 200, 1000, 2048, 4096, 8192, 16000, 32000):
            made = build_map(clone, budget_tokens=size, cache_dir=cache, count=counter)
            overshoot = max(overshoot, made.tokens - size, counter(made.text) - size)
    stats = first.stats  # type: ignore[attr-defined]
    return {
        "files": stats.files,
        "parsed_cold": stats.parsed,
        "skipped": stats.skipped,
        "cold": cold,
        "cold_cpu": cold_cpu,
        "warm": warm,
        "warm_cpu": warm_cpu,
        "incremental": incremental,
        "incremental_cpu": incremental_cpu,
        "incremental_parsed": parsed,
        "changed": changed.relative_to(clone).as_posix(),
        "overshoot": overshoot,
        "tracked": len(git(clone, "ls-files").splitlines()),
        "load": (load, os.getloadavg()[0]),
    }


def cpu_seconds() -> float:
    """CPU time of this process and its ended children (the spawned taggers)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _new_function(suffix: str, n: int) -> str:
    return {
        ".py": f"\n\ndef bench_added_{n}(value):\n    return value\n",
        ".go": f"\nfunc benchAdded{n}(value int) int {{ return value }}\n",
        ".rs": f"\nfn bench_added_{n}(value: i32) -> i32 {{ value }}\n",
    }.get(suffix, f"\nfunction benchAdded{n}(value) {{ return value }}\n")


def smoke_repo(work: Path) -> Path:
    """This repository, or (outside a clone of it) a tiny one made here."""
    if (ROOT / ".git").exists():
        return ROOT
    repo = work / "tiny"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "core.py").write_text("class Engine:\n    def run(self):\n        return 1\n")
    (repo / "pkg" / "cli.py").write_text("from pkg.core import Engine\n\nEngine().run()\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for args in (["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", *args], cwd=repo)
    return repo


def cpu(figures: dict[str, object], name: str) -> str:
    values = figures[name]
    assert isinstance(values, list)
    return f"{statistics.median(values):.3f} s"


def seconds(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (max {max(values):.3f})"


def report(
    figures: dict[str, object],
    outcomes: list[Outcome],
    repo: Path,
    budget: int,
    held_out: set[str] | None = None,
) -> str:
    cold = figures["cold"]
    warm = figures["warm"]
    incremental = figures["incremental"]
    assert isinstance(cold, list)
    assert isinstance(warm, list)
    assert isinstance(incremental, list)
    lines = [
        f"| Figure ({repo.name}: {figures['tracked']} files, {figures['files']} mapped) "
        "| Measured | Target |",
        "|---|---|---|",
        f"| cold build ({figures['parsed_cold']} tagged, {figures['skipped']} skipped; CPU "
        f"{statistics.median(figures['cold_cpu']):.1f} s) | {seconds(cold)} | 5 s |",  # type: ignore[arg-type]
        f"| warm build (nothing changed; CPU {cpu(figures, 'warm_cpu')}) | {seconds(warm)} "
        "| 0.5 s |",
        f"| incremental (one file changed: {figures['changed']}; tagged "
        f"{sorted(set(figures['incremental_parsed']))}; CPU {cpu(figures, 'incremental_cpu')}) "  # type: ignore[call-overload]
        f"| {seconds(incremental)} | 0.3 s |",
        f"| largest tokens - budget, budgets 0-32,000, two counters | {figures['overshoot']} "
        "| <= 0 |",
        "| the machine's load average (1 min) before and after the timings (2 cores) "
        f"| {' / '.join(f'{value:.2f}' for value in figures['load'])} | |",  # type: ignore[attr-defined]
    ]
    by_repo: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_repo.setdefault(outcome.task.repo.name, []).append(outcome)
    for name, done in by_repo.items():
        hits = sum(1 for o in done if 0 < o.position <= TOP)
        time_each = statistics.median(o.seconds for o in done)
        lines.append(
            f"| hit rate, {name}: {hits}/{len(done)} in the first {TOP} "
            f"(median build {time_each:.2f} s) | {hits / len(done):.0%} | |"
        )
    held_out = held_out or set()
    groups = [("held-in", [o for o in outcomes if o.task.repo.name not in held_out])]
    groups.append(("held-out", [o for o in outcomes if o.task.repo.name in held_out]))
    groups.append(("all", outcomes))
    for label, done in groups:
        if done and (label != "all" or held_out):
            hits = sum(1 for o in done if 0 < o.position <= TOP)
            lines.append(
                f"| **hit rate, {label}: {hits}/{len(done)} tasks** (budget {budget}) "
                f"| **{hits / len(done):.0%}** | 70% |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repo", type=Path, help="a git clone to time (about 2,000 files)")
    parser.add_argument("--tasks-from", type=Path, nargs="*", help="clones to make tasks of")
    parser.add_argument(
        "--held-out", type=Path, nargs="*", default=[], help="clones whose tasks tuned nothing"
    )
    parser.add_argument("--tasks", type=int, default=12, help="tasks per repository")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--smoke", action="store_true", help="seconds, on this repository")
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="repo-map-bench-") as folder:
        work = Path(folder)
        if args.smoke:
            repo = smoke_repo(work)
            args.rounds, args.tasks, args.no_docs = 2, 3, True
            sources = [repo]
        elif args.repo is None:
            parser.error("--repo PATH is needed (or --smoke)")
        else:
            repo = args.repo.resolve()
            sources = [path.resolve() for path in (args.tasks_from or [repo])]
            sources += [path.resolve() for path in args.held_out]
        figures = timings(repo, work, args.rounds, args.budget)
        tasks = [task for source in sources for task in tasks_of(source, args.tasks)]
        outcomes = hit_rate(tasks, work / "tasks-cache", args.budget)
    for outcome in outcomes:
        if not 0 < outcome.position <= TOP:
            task = outcome.task
            print(f"miss {task.repo.name} {task.commit[:10]} {task.target} at {outcome.position}")
            print("    " + task.description.replace("\n", " ")[:160])
    held_out = {path.resolve().name for path in args.held_out}
    text = report(figures, outcomes, repo, args.budget, held_out)
    print(text)
    if not args.no_docs:
        section = f"{HEADING}\n\n{SECTION_INTRO}\n\n{text}\n"
        write_section(args.docs, HEADING, section)
        print(f"\nwrote the section {HEADING[3:]!r} of {args.docs}")


if __name__ == "__main__":
    main()
