"""Benchmark: the embedded broker's polling interval, per-step overhead against idle CPU.

Run: ``python -m tests.bench.broker_poll`` (about 2 minutes). For each interval it starts a
real ``merlin worker`` (prefork, 2 processes) on a fresh MERLIN_HOME, measures the CPU the
idle worker burns over 10 s, then runs jobs of 5 steps whose scripted model answers at once
and whose exit command is ``true``, so the time per step is orchestration alone (two chain
hops, the lease claims, two git worktrees, the commit). Prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from merlin_flow.store import Job, open_database
from tests.conftest import make_repo
from tests.e2e.helpers import (
    merlin,
    merlin_env,
    start_worker,
    stop_worker,
    wait_for,
    write_job_files,
)

INTERVALS = [0.02, 0.05, 0.1, 0.25]
STEPS = 5
JOBS = 3
IDLE_SECONDS = 10.0
INSTANT = "rules:\n  - reply: {content: done}\n"
TASKLIST = "title: overhead\nsteps:\n" + "".join(
    f"  - {{id: s{i}, step_type: Verify, description: step {i}, exit_command: 'true'}}\n"
    for i in range(STEPS)
)


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def measure(interval: float, work: Path) -> dict[str, float]:
    """Idle CPU and per-step time for one polling interval."""
    home = work / f"home-{interval}"
    env = merlin_env(home, MERLIN_BROKER_POLL_INTERVAL=str(interval), MERLIN_SWEEP_INTERVAL="15")
    tasklist, config = write_job_files(work / f"job-{interval}", local=INSTANT, tasklist=TASKLIST)
    repo = make_repo(work / f"repo-{interval}", {"README.md": "bench\n"})
    log = work / f"worker-{interval}.log"
    worker = start_worker(env, log, "--concurrency", "2")
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), 60, "the worker to start")
        time.sleep(2)
        cpu0 = group_cpu_seconds(worker.pid)
        time.sleep(IDLE_SECONDS)
        idle = (group_cpu_seconds(worker.pid) - cpu0) / IDLE_SECONDS * 100
        db = open_database(f"sqlite:///{home / 'merlin.db'}")
        per_step = []
        for _ in range(JOBS):
            out = merlin(
                env, "submit", str(tasklist), "--repo", str(repo), "--config", str(config), "--json"
            )
            job_id = json.loads(out.stdout)["job_id"]

            def finished(job_id: str = job_id) -> Job | None:
                with db.session() as session:
                    job = session.get(Job, job_id)
                    return job if job is not None and job.finished_at is not None else None

            job = wait_for(finished, 120, "the job", poll=0.05)
            assert job.status == "completed", job.error
            per_step.append((job.finished_at - job.started_at).total_seconds() / STEPS)
        db.dispose()
    finally:
        stop_worker(worker)
    return {"interval": interval, "idle_cpu": idle, "per_step": statistics.median(per_step)}


def main() -> None:
    """Run every interval and print the table."""
    with tempfile.TemporaryDirectory(prefix="merlin-bench-") as tmp:
        rows = [measure(interval, Path(tmp)) for interval in INTERVALS]
    print(
        "| polling interval | idle worker CPU (% of one core) "
        f"| time per step (median of {JOBS} jobs x {STEPS} steps) |"
    )
    print("|---|---|---|")
    for row in rows:
        print(
            f"| {row['interval']:g} s | {row['idle_cpu']:.1f}% | {row['per_step'] * 1000:.0f} ms |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
