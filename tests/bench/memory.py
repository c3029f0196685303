"""Benchmark: the memory of each process the shipped deployment runs, as deploy/ sizes it.

Run: ``python -m tests.bench.memory [--smoke]``. On a Postgres database and a Redis
server of the run's own (as ``tests.bench.overhead``), it starts each long-running
process with the command deploy/compose.yaml and deploy/k8s give it, waits until it is
ready and has been idle for ``--idle`` seconds, and reads the proportional set size
(PSS, ``/proc/PID/smaps_rollup``) of its whole process group: a prefork worker's
children share the parent's pages, and PSS counts each shared page once across them.
The one-shot commands (the migration, ``merlin doctor --json``, what the healthchecks
run) are measured by their peak resident size (``ru_maxrss`` from ``wait4``).

Without ``--smoke`` it writes its section of docs/BENCHMARKS.md; ``--smoke`` measures
each once with a short idle, the verify worker at 2 processes only, and writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from tests.bench.docs_section import write_section
from tests.bench.processes import stop_group, terminated_as_exit, wait_until

HEADING = "## Memory of the deployed processes"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARKS.md"
MERLIN = [sys.executable, "-m", "merlin_flow.cli"]
LLM = ["worker", "--queues", "llm,control", "--pool", "threads", "--concurrency", "8"]
"""The llm worker of deploy/compose.yaml and deploy/k8s/worker-llm.yaml."""
VERIFY = ["worker", "--queues", "verify", "--pool", "prefork", "--concurrency"]
"""The verify worker, one process per core (given here: 2, then 4)."""


@dataclass(frozen=True)
class Figure:
    """One process's memory, in MiB."""

    what: str
    command: str
    mib: float
    how: str


def group_pss_kib(leader: int) -> int:
    """The PSS (KiB) of every process in ``leader``'s process group."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            group = int(stat.rsplit(")", 1)[1].split()[2])
            if group != leader:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def peak_rss_mib(args: list[str], env: dict[str, str], codes: tuple[int, ...] = (0,)) -> float:
    """Run ``merlin ARGS`` to its end (exit status in ``codes``); its own peak resident size."""
    process = subprocess.Popen(
        [*MERLIN, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    errors = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode not in codes:
        raise SystemExit(f"merlin {' '.join(args)} exited {process.returncode}: {errors}")
    return usage.ru_maxrss / 1024


@contextlib.contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``merlin ARGS`` in a process group of its own, stopped whole afterwards."""
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [*MERLIN, *args], env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield process
    finally:
        stop_group(process)


def idle_worker_mib(args: list[str], env: dict[str, str], log: Path, idle: float) -> float:
    """The PSS of a worker's process group once it is ready and has idled ``idle`` s."""
    with started([*args, "--loglevel", "INFO"], env, log) as worker:
        wait_until(lambda: "ready." in log.read_text(errors="replace"), "the worker", [worker],
                   [log])  # fmt: skip
        time.sleep(idle)
        return group_pss_kib(worker.pid) / 1024


def idle_ui_mib(env: dict[str, str], log: Path, idle: float) -> float:
    """The PSS of ``merlin ui`` once it has served its jobs page and idled ``idle`` s."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"

    def answers() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
        return False

    with started(["ui", "--port", str(port)], env, log) as ui:
        wait_until(answers, f"merlin ui on {url}", [ui], [log])
        time.sleep(idle)
        return group_pss_kib(ui.pid) / 1024


def measure(env: dict[str, str], work: Path, idle: float, smoke: bool = False) -> list[Figure]:
    """Every figure, on the backend ``env`` names (``smoke``: the verify worker at 2 only)."""
    upgrade = peak_rss_mib(["db", "upgrade"], env)
    # doctor exits 1 here: no worker serves the queues yet, no tier has a key.
    doctor = peak_rss_mib(["doctor", "--json"], env, codes=(0, 1))
    llm = idle_worker_mib(LLM, env, work / "llm.log", idle)
    figures = [
        Figure("migration", "merlin db upgrade", upgrade, "peak RSS"),
        Figure("healthcheck, readiness", "merlin doctor --json", doctor, "peak RSS"),
        Figure("llm worker, idle", "merlin " + " ".join(LLM), llm, "PSS, process group"),
    ]
    for processes in (2,) if smoke else (2, 4):
        args = [*VERIFY, str(processes)]
        mib = idle_worker_mib(args, env, work / f"verify{processes}.log", idle)
        what = f"verify worker, idle, {processes} processes"
        figures.append(Figure(what, "merlin " + " ".join(args), mib, "PSS, process group"))
    ui = idle_ui_mib(env, work / "ui.log", idle)
    figures.append(Figure("dashboard, idle", "merlin ui --port PORT", ui, "PSS"))
    return figures


def table(figures: list[Figure]) -> str:
    """The figures as a Markdown table, with the cost of each further verify process."""
    rows = [f"| {f.what} | `{f.command}` | {f.mib:.0f} MiB | {f.how} |" for f in figures]
    verify = {n: f.mib for n in (2, 4) for f in figures if f"{n} processes" in f.what}
    if len(verify) == 2:
        each = (verify[4] - verify[2]) / 2
        rows.append(
            f"| each further verify process | (4 processes - 2) / 2 | {each:.0f} MiB | PSS |"
        )
    header = "| process | command | memory | measured as |\n|---|---|---|---|\n"
    return header + "\n".join(rows) + "\n"


def section(figures: list[Figure], idle: float) -> str:
    """This benchmark's section of docs/BENCHMARKS.md."""
    return (
        f"{HEADING}\n\n"
        "Command: `python -m tests.bench.memory` (about a minute). On a Postgres database and\n"
        "a Redis server of its own, each process runs with the command deploy/ gives it;\n"
        f"a long-running one is measured once ready and idle for {idle:g} s, as the PSS of its\n"
        "process group (shared pages counted once), a one-shot one by its peak RSS. The\n"
        "limits and requests in deploy/compose.yaml and deploy/k8s/ add to these the\n"
        "healthcheck's `merlin doctor` and the steps' own commands.\n\n"
        f"Run of {date.today().isoformat()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores:\n\n{table(figures)}"
    )


def main() -> None:
    """Measure every process of the deployment on Redis + Postgres; print the table."""
    from tests.bench.overhead import Unavailable, scaled_env
    from tests.e2e.helpers import merlin_env

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--idle", type=float, default=10.0, help="seconds idle before reading")
    parser.add_argument("--smoke", action="store_true", help="1 s idle; no docs written")
    parser.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    idle = 1.0 if args.smoke else args.idle
    with terminated_as_exit(), tempfile.TemporaryDirectory(prefix="merlin-memory-") as tmp:
        work = Path(tmp)
        try:
            with scaled_env(work) as backend:
                env = merlin_env(work / "home", **backend)
                env.pop("MERLIN_SWEEP_INTERVAL")  # the deployment's own sweep
                figures = measure(env, work, idle, args.smoke)
        except Unavailable as exc:
            if not args.smoke or os.environ.get("CI"):
                raise SystemExit(f"redis+postgres: {exc}") from None
            print(f"skipped: {exc}", file=sys.stderr)
            return
    print(table(figures))
    if not args.smoke:
        write_section(args.docs, HEADING, section(figures, idle))


if __name__ == "__main__":
    main()
