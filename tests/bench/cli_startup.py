"""Benchmark: how long `merlin --help` and `merlin list` take to start.

Run: ``python -m tests.bench.cli_startup``. Each command runs 10 times in a fresh process
(on an empty MERLIN_HOME for `list`); prints the median and the slowest run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 10
COMMANDS = [["--help"], ["list", "--json"]]


def time_command(args: list[str], env: dict[str, str]) -> list[float]:
    """Wall-clock seconds of RUNS fresh `merlin ARGS` processes."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "merlin_flow.cli", *args],
            env=env,
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    """Print a Markdown table of start-up times."""
    with tempfile.TemporaryDirectory(prefix="merlin-bench-") as home:
        env = {**os.environ, "MERLIN_HOME": home}
        env.pop("MERLIN_DATABASE_URL", None)
        print(f"| command | median of {RUNS} | slowest |")
        print("|---|---|---|")
        for args in COMMANDS:
            times = time_command(args, env)
            print(
                f"| `merlin {' '.join(args)}` | {statistics.median(times) * 1000:.0f} ms "
                f"| {max(times) * 1000:.0f} ms |"
            )


if __name__ == "__main__":
    main()
