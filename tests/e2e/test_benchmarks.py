"""Every benchmark at its smallest size (``--smoke``), so that none rots unseen.

A benchmark is a module of ``tests/bench`` with a ``main`` function; a new one is
found and run here without more ado. Each runs as ``python -m tests.bench.NAME --smoke``
in its own process, as a user runs it, and must end with status 0, leave
docs/BENCHMARKS.md as it was, and leave nothing behind: no process (each process it
starts inherits a mark in its environment, looked for in ``/proc`` afterwards) and no
file in its temporary folder (``TMPDIR``). The figures are not checked: a loaded CI
machine says nothing about them.
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.bench.processes import log_tail
from tests.conftest import require_bwrap

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
DOCS = ROOT / "docs" / "BENCHMARKS.md"
NOT_BENCHMARKS = frozenset({"__init__", "docs_section", "noop_worker"})
SECONDS = 240
"""How long one smoke run may take (they take 5 to 60 s); then SIGTERM, which it obeys."""
MARK = "MERLIN_BENCH_SMOKE"


def benchmarks() -> list[str]:
    """The modules of tests/bench that define ``main``, read without importing them."""
    found = []
    for path in sorted(BENCH.glob("*.py")):
        if path.stem in NOT_BENCHMARKS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(path.stem)
    return found


def marked_processes(mark: str) -> list[int]:
    """The live processes whose environment carries ``MARK=mark``."""
    wanted = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def test_the_benchmarks_are_found() -> None:
    assert {"overhead", "dag", "dashboard", "cascade", "sandbox"} <= set(benchmarks())
    assert "processes" not in benchmarks()  # helpers have no main


@pytest.mark.timeout(SECONDS + 120)
@pytest.mark.parametrize("name", benchmarks())
def test_the_benchmark_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    require_bwrap()  # every benchmark but a few runs step commands in the sandbox
    docs = DOCS.read_bytes()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    output = tmp_path / "output.txt"
    mark = uuid.uuid4().hex
    env = {**os.environ, "TMPDIR": str(temporary), MARK: mark}
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", f"tests.bench.{name}", "--smoke"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        process.wait(timeout=SECONDS)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # it stops what it started, then ends
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    finally:
        left = marked_processes(mark)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    said = log_tail(output, 60)
    command = f"python -m tests.bench.{name} --smoke"
    assert process.returncode == 0, f"`{command}` ended {process.returncode}:\n{said}"
    assert not left, f"{name} left processes running: {left}\n{said}"
    assert DOCS.read_bytes() == docs, f"{name} --smoke changed {DOCS}"
    assert not list(temporary.iterdir()), f"{name} left files: {list(temporary.iterdir())}"
