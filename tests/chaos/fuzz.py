"""The full fuzzing run: every reader of ``tests/fuzz_inputs.py`` on many generated inputs.

    python -m tests.chaos.fuzz --examples 10000 [--only NAME] [--seed N] [--cli 100]

Each property runs ``--examples`` generated inputs; a failure (another exception than the
documented one, or an unhelpful message) is counted and the run goes on. The table at the
end gives, per property, the examples run, the failures and the seconds; the first
failures are printed with their input. ``--cli`` runs that many fuzzed TaskList files
through ``merlin run FILE --repo R`` (CliRunner): exit code 2, no traceback. The exit
status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz_inputs import PROPERTIES, Property, Unexpected, tasklist_documents

SHOWN = 3
"""Failures printed per property."""


@dataclass
class Outcome:
    """What one property's run found."""

    name: str
    examples: int = 0
    failures: list[tuple[Any, str]] = field(default_factory=list)
    seconds: float = 0.0


def run_property(prop: Property, examples: int, random_seed: int) -> Outcome:
    """Run ``prop`` on ``examples`` generated inputs, counting failures, not stopping."""
    outcome = Outcome(prop.name)

    @seed(random_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(prop.strategy)
    def trial(value: Any) -> None:
        outcome.examples += 1
        try:
            prop.check(value)
        except Unexpected as exc:
            outcome.failures.append((value, str(exc)))

    started = time.monotonic()
    trial()
    outcome.seconds = time.monotonic() - started
    return outcome


def check_cli(doc: Any, repo: Path, folder: Path) -> None:
    """``merlin run FILE --repo R`` on a fuzzed invalid TaskList: exit 2, no traceback."""
    from typer.testing import CliRunner

    from merlin_flow.cli.app import app
    from merlin_flow.errors import TaskListError
    from merlin_flow.tasklist import load_tasklist

    path = doc.write(folder)
    try:
        load_tasklist(path).check_submittable()
    except TaskListError:
        pass
    else:
        return  # a valid TaskList: running it is not what this property checks
    result = CliRunner().invoke(app, ["run", str(path), "--repo", str(repo)])
    output = result.output
    if result.exit_code == 2 and "Traceback" not in output and "error:" in output:
        return
    raise Unexpected(
        f"merlin run: exit {result.exit_code}, exception {result.exception!r}\n{output[-1500:]}"
    )


def cli_property(repo: Path, folder: Path) -> Property:
    """The CLI check as a property over fuzzed TaskList files."""
    return Property("cli run (exit 2)", tasklist_documents(), lambda d: check_cli(d, repo, folder))


def make_repo(folder: Path) -> Path:
    """A git repository with a scripted-only merlin.toml whose script answers nothing."""
    repo = folder / "repo"
    repo.mkdir()
    (repo / "merlin.toml").write_text('[[tiers]]\nname = "local"\nmodel = "scripted/s.yaml"\n')
    (repo / "s.yaml").write_text("rules: []\n")
    (repo / "app.py").write_text("x = 1\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["-c", "user.name=f", "-c", "user.email=f@x", "commit", "-qm", "init"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def main(argv: list[str] | None = None) -> int:
    """Run the properties; print the table; 1 when any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--only", action="append", help="a property's name (repeatable)")
    parser.add_argument("--cli", type=int, default=1000, help="fuzzed TaskLists run by the CLI")
    args = parser.parse_args(argv)
    outcomes = []
    with tempfile.TemporaryDirectory() as scratch:
        import os

        os.environ["MERLIN_HOME"] = str(Path(scratch) / "home")
        for name in ("MERLIN_DATABASE_URL", "MERLIN_BROKER_URL"):
            os.environ.pop(name, None)
        properties = [(p, args.examples) for p in PROPERTIES]
        if args.cli:
            cli_folder = Path(scratch) / "cli"
            cli_folder.mkdir()
            properties.append((cli_property(make_repo(Path(scratch)), cli_folder), args.cli))
        for prop, examples in properties:
            if args.only and prop.name not in args.only:
                continue
            print(f"{prop.name}: {examples} examples...", file=sys.stderr, flush=True)
            outcomes.append(run_property(prop, examples, args.seed))
    for outcome in outcomes:
        for value, problem in outcome.failures[:SHOWN]:
            print(f"--- {outcome.name}: {problem}\n    input: {value!r}"[:4000])
    width = max(len(o.name) for o in outcomes) if outcomes else 8
    print(f"\n{'property':<{width}}  {'examples':>8}  {'failures':>8}  {'seconds':>8}")
    for o in outcomes:
        print(f"{o.name:<{width}}  {o.examples:>8}  {len(o.failures):>8}  {o.seconds:>8.1f}")
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
