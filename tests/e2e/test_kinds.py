"""A Rust crate, a Node package and a Go module, each with one real dependency.

For each kind, the default setup builds the project's environment once (with the
network: ``cargo fetch``, ``npm ci``, ``go mod download``), and the exit command (a
``Test`` step's default: ``cargo test``, ``npm test``, ``go test ./...``) runs in the
sandbox without it. An honest step (a function and its test) passes; a step that breaks
an existing test fails on every tier, with the failing test's output in the job's
error or its logs. The second job reuses the first job's environment.

The dependencies come from where this machine (and CI, after ``.ci/run``) has them:
Debian's crate sources for ``itoa`` (the crate's own ``.cargo/config.toml`` replaces
crates.io with them, as a vendored crate does), the npm registry for ``is-number``, and
Debian's go-cmp served by a module proxy of the tests' own (``tests/go_proxy.py``).
The projects are in ``tests/fixtures/kinds``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from tests.conftest import git, make_repo
from tests.e2e.helpers import merlin, merlin_env, one_step, write_job_files
from tests.go_proxy import NoModuleSource, go_proxy

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kinds"
JOB_TIMEOUT = 400
GO_CMP = "github.com/google/go-cmp"
GROW = "add a function, with a test"
BREAK = "simplify the code"


@dataclass(frozen=True)
class Kind:
    """A kind of project, the honest and the breaking step's edits, and what they show."""

    name: str
    grow: list[dict[str, Any]]
    """The honest step's tool calls: a function and its test."""
    grown: tuple[str, ...]
    """Patterns of what the passing exit command prints (in ``merlin logs``): the new test."""
    breaks: dict[str, str]
    """The breaking step's edit_file arguments: an existing test fails."""
    failing: tuple[str, ...]
    """What the failing exit command prints: the test's name and its assertion."""
    in_error: str
    """What the job's error quotes of it (the output's last lines)."""
    failed_code: int
    """The exit code of the failing test suite."""
    built: tuple[str, ...] = field(default=())
    """Globs that match in the environment folder once it is built."""
    compiled_once: str | None = None
    """What the first job's exit command prints building the dependency, which later
    attempts, building incrementally in the environment's build cache, do not."""


def write(path: str, content: str) -> dict[str, Any]:
    """A write_file tool call."""
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def edit(path: str, old: str, new: str) -> dict[str, Any]:
    """An edit_file tool call."""
    return {"name": "edit_file", "arguments": {"path": path, "old": old, "new": new}}


RUST = Kind(
    name="rust",
    grow=[
        edit(
            "src/lib.rs",
            "#[cfg(test)]",
            "/// `n` in decimal, without its sign.\n"
            "pub fn magnitude(n: i64) -> String {\n"
            "    itoa::Buffer::new().format(n.unsigned_abs()).to_owned()\n"
            "}\n\n#[cfg(test)]",
        ),
        write(
            "tests/magnitude.rs",
            "#[test]\nfn magnitude_of_a_negative_number() {\n"
            '    assert_eq!(fmtnum::magnitude(-1234), "1234");\n}\n',
        ),
    ],
    grown=(r"test magnitude_of_a_negative_number \.\.\. ok",),
    breaks={
        "path": "src/lib.rs",
        "old": "buffer.format(n)",
        "new": "buffer.format(n.unsigned_abs())",
    },
    failing=("test tests::decimal_of_a_negative_number ... FAILED", 'right: "-1234"'),
    in_error="tests::decimal_of_a_negative_number",
    failed_code=101,  # a panic
    built=("build/target/debug/deps",),
    compiled_once="Compiling itoa v1.",
)
NODE = Kind(
    name="node",
    grow=[
        edit(
            "index.js",
            "module.exports = { sumNumbers };",
            "/** How many of the values are numbers (or numeric strings). */\n"
            "function countNumbers(values) {\n  return values.filter(isNumber).length;\n}\n\n"
            "module.exports = { countNumbers, sumNumbers };",
        ),
        write(
            "test/count.test.js",
            'const test = require("node:test");\nconst assert = require("node:assert");\n'
            'const { countNumbers } = require("..");\n\n'
            'test("countNumbers counts numeric strings too", () => {\n'
            '  assert.strictEqual(countNumbers([1, "2", "x", NaN]), 2);\n});\n',
        ),
    ],
    grown=(r"ok \d - countNumbers counts numeric strings too", "# pass 2"),
    breaks={"path": "index.js", "old": "values.filter(isNumber)", "new": "values"},
    failing=("not ok 1 - sumNumbers skips what is not a number", "NaN !== 7"),
    in_error="# fail 1",
    failed_code=1,
    built=("node_modules/is-number/package.json",),
)
GO = Kind(
    name="go",
    grow=[
        write(
            "same.go",
            'package cmpdemo\n\nimport "github.com/google/go-cmp/cmp"\n\n'
            "// Same reports whether a and b hold the same counts.\n"
            "func Same(a, b map[string]int) bool {\n\treturn cmp.Equal(a, b)\n}\n",
        ),
        write(
            "same_test.go",
            'package cmpdemo\n\nimport "testing"\n\n'
            "func TestSameCounts(t *testing.T) {\n"
            '\tif !Same(map[string]int{"a": 1}, map[string]int{"a": 1}) {\n'
            '\t\tt.Error("equal maps are not the same")\n\t}\n'
            '\tif Same(map[string]int{"a": 1}, map[string]int{"a": 2}) {\n'
            '\t\tt.Error("different maps are the same")\n\t}\n}\n',
        ),
    ],
    grown=(r"ok\s+example\.com/cmpdemo",),  # `go test` names no test without -v
    breaks={
        "path": "diff.go",
        "old": "return cmp.Diff(old, new)",
        "new": 'return "changed: " + cmp.Diff(old, new)',
    },
    failing=("--- FAIL: TestChangesOfEqualSlices", 'Changes of equal slices = "changed: "'),
    in_error="--- FAIL: TestChangesOfEqualSlices",
    failed_code=1,
    built=(f"gomod/{GO_CMP}@v*/cmp/compare.go", "gomod/cache/download"),
)


def script(kind: Kind) -> str:
    """The scripted model of both tiers: step ``grow`` is honest, step ``break`` is not."""
    rules: list[dict[str, Any]] = [
        {"match": r"Step grow \(", "turn": 0, "reply": {"tool_calls": kind.grow}},
        {"match": r"Step grow \(", "reply": {"content": "added, with a test"}},
        {
            "match": r"Step break \(",
            "turn": 0,
            "reply": {"tool_calls": [{"name": "edit_file", "arguments": kind.breaks}]},
        },
        {"match": r"Step break \(", "reply": {"content": "simplified"}},
    ]
    return yaml.safe_dump({"rules": rules}, sort_keys=False)


def unavailable(reason: str) -> NoReturn:
    """Skip the test here; in CI (where .ci/run installs everything), fail it."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def cargo() -> str | None:
    """The worker user's cargo: on PATH, or rustup's."""
    home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    rustup = home / "bin" / "cargo"
    return shutil.which("cargo") or (str(rustup) if os.access(rustup, os.X_OK) else None)


@contextmanager
def project(kind: Kind, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The kind's fixture, committed in a fresh repository; and what merlin needs set."""
    repo = tmp_path / f"{kind.name}-project"
    shutil.copytree(FIXTURES / kind.name, repo)
    if kind is RUST:
        if cargo() is None:
            unavailable("no cargo (rustup's or Debian's `cargo`)")
        if not list(Path("/usr/share/cargo/registry").glob("itoa-1.*")):
            unavailable("no Debian crate sources of itoa (apt-get install librust-itoa-dev)")
        yield make_repo(repo, {}), {}
        return
    if kind is NODE:
        if shutil.which("npm") is None or shutil.which("node") is None:
            unavailable("no node and npm")
        yield make_repo(repo, {}), {}
        return
    if shutil.which("go") is None:
        unavailable("no go (apt-get install golang)")
    with ExitStack() as stack:
        try:
            proxy = stack.enter_context(go_proxy({GO_CMP: "golang-github-google-go-cmp-dev"}))
        except NoModuleSource as exc:
            unavailable(f"{exc} (apt-get install golang-github-google-go-cmp-dev)")
        # Setup (which has the network) downloads from the proxy; go.sum holds the
        # hashes of Debian's content, which the checksum database does not know.
        go_env = {"GOPROXY": proxy.url, "GOSUMDB": "off"}
        tidy(repo, tmp_path / "go-tidy", go_env)
        assert f"require {GO_CMP} {proxy.versions[GO_CMP]}" in (repo / "go.mod").read_text()
        yield make_repo(repo, {}), go_env


def tidy(repo: Path, scratch: Path, go_env: dict[str, str]) -> None:
    """`go mod tidy` against the proxy: the require line and go.sum the module commits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env |= go_env | {
        "GOMODCACHE": str(scratch / "mod"),
        "GOCACHE": str(scratch / "cache"),
        "GOFLAGS": "-modcacherw",  # so pytest can remove it
        "GOTOOLCHAIN": "local",
    }
    proc = subprocess.run(
        ["go", "mod", "tidy"], cwd=repo, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@dataclass(frozen=True)
class Run:
    """A finished `merlin run --json`: its exit code, the job, its output, its length."""

    code: int
    view: dict[str, Any]
    output: str
    seconds: float


def run_job(env: dict[str, str], tasklist: Path, repo: Path, config: Path) -> Run:
    """`merlin run TASKLIST --json` on ``repo``, timed."""
    started = time.monotonic()
    result = merlin(
        env, "run", str(tasklist), "--repo", str(repo), "--config", str(config), "--json",
        timeout=JOB_TIMEOUT,
    )  # fmt: skip
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    try:
        view = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"merlin run printed no job: {output}")
    return Run(result.returncode, view, output, seconds)


def builds(home: Path) -> list[str]:
    """The messages of the ``environment_built`` events (``environment X built in S s``)."""
    with closing(sqlite3.connect(home / "merlin.db")) as conn:
        rows = conn.execute("SELECT message FROM events WHERE kind = 'environment_built'")
        return [message for (message,) in rows]


@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)
@pytest.mark.parametrize("kind", [RUST, NODE, GO], ids=lambda kind: kind.name)
def test_a_kind_passes_an_honest_step_and_fails_a_breaking_one(kind: Kind, tmp_path: Path) -> None:
    with project(kind, tmp_path) as (repo, extra):
        head = git(repo, "rev-parse", "HEAD")
        home = tmp_path / "home"
        env = merlin_env(home, **extra)
        local = script(kind)
        _, config = write_job_files(tmp_path / "job", local=local, premium=local)

        good = run_job(env, one_step(tmp_path / "good.yaml", "grow", GROW, "Test"), repo, config)
        assert good.code == 0, good.output
        assert good.view["status"] == "completed", good.output
        first_logs = merlin(env, "logs", good.view["id"], "--step", "grow").stdout
        for shown in kind.grown:  # the new test ran, and passed
            assert re.search(shown, first_logs), first_logs
        (built,) = builds(home)
        (folder,) = [p for p in (home / "envs").iterdir() if p.is_dir()]
        for pattern in kind.built:
            assert list(folder.glob(pattern)), f"no {pattern} in {folder}"

        bad = run_job(env, one_step(tmp_path / "bad.yaml", "break", BREAK, "Test"), repo, config)
        timing = (
            f"{kind.name}: first job {good.seconds:.1f} s ({built}), second job {bad.seconds:.1f} s"
        )
        print(f"{timing}\n{kind.name}: error: {bad.view['error']}")
        assert bad.code == 1, f"{timing}\n{bad.output}"
        assert bad.view["status"] == "failed", bad.output
        (step,) = bad.view["steps"]
        attempts = [(a["kind"], a["tier"], a["exit_code"]) for a in step["attempts"]]
        assert attempts[0] == ("execute", "local", kind.failed_code), attempts
        assert ("escalate", "premium", kind.failed_code) in attempts, attempts
        # The failing test: in the job's error (the output's last lines), and in full
        # in its logs.
        assert kind.in_error in bad.view["error"], bad.view["error"]
        logs = merlin(env, "logs", bad.view["id"], "--step", "break").stdout
        for shown in kind.failing:
            assert shown in logs, logs
        if kind.compiled_once:
            assert kind.compiled_once in first_logs, first_logs
            assert kind.compiled_once not in logs, logs

        # One environment for both jobs: setup ran once.
        assert builds(home) == [built], timing
        assert [p for p in (home / "envs").iterdir() if p.is_dir()] == [folder], timing

        # The user's checkout: same HEAD, nothing new.
        assert git(repo, "rev-parse", "HEAD") == head
        assert git(repo, "status", "--porcelain") == ""
