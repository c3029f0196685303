"""The project's environment: its plan by project kind, its cache key, one build per key."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import SetupFailed
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Environment
from merlin_flow.workspace.checkout import confine
from merlin_flow.workspace.default_setup import interpreter
from merlin_flow.workspace.environment import (
    MARKER_FILE,
    BuiltEnvironment,
    ensure_environment,
    plan_environment,
    prepare_worktree,
    setup_checkouts,
)
from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.network import describe
from merlin_flow.workspace.sandbox import run_confined
from tests.conftest import git, make_repo, require_bwrap

HATCH_PROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pkg"
version = "0.1"

[project.optional-dependencies]
test = ["pytest"]
docs = ["sphinx"]
"""

COUNTING_SETUP = ['echo run >> "$MERLIN_ENV/runs"', "cp -r /workspace/src $MERLIN_ENV/src"]


def config(setup: list[str] | None = None, cache_key: list[str] | None = None) -> MerlinConfig:
    return MerlinConfig(
        tiers=[Tier(name="t", model="scripted/none.yaml")],
        environment=Environment(setup=setup, cache_key=cache_key),
    )


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def commit(repo: Path, files: dict[str, str]) -> str:
    for name, content in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(content)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    return head(repo)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", uv_cache_dir=tmp_path / "uv-cache")


@pytest.fixture
def src_repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "repo",
        {"pyproject.toml": HATCH_PROJECT, "src/pkg/__init__.py": "VALUE = 1\n"},
    )


@pytest.fixture
def needs_bwrap() -> None:
    require_bwrap()


def test_default_python_setup_installs_the_project_editable_with_test_extras(
    src_repo: Path,
) -> None:
    plan = plan_environment(src_repo, head(src_repo), config())
    assert plan.kind is ProjectKind.PYTHON
    assert plan.default
    assert plan.setup[0].startswith("uv venv ")
    assert plan.setup[1] == "uv pip install --quiet -e '.[test]' pytest"


def test_a_project_that_is_not_installable_gets_its_requirements(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "flat",
        {
            "pyproject.toml": '[project]\nname = "x"\nversion = "0"\ndependencies = ["attrs"]\n',
            "requirements-test.txt": "hypothesis\n",
            "app.py": "",
        },
    )
    plan = plan_environment(repo, head(repo), config())
    assert (
        plan.setup[1] == "uv pip install --quiet -r pyproject.toml -r requirements-test.txt pytest"
    )


def test_configured_setup_is_taken_as_written_and_empty_means_none(src_repo: Path) -> None:
    plan = plan_environment(src_repo, head(src_repo), config(setup=["make env"]))
    assert plan.setup == ["make env"]
    assert not plan.default
    assert not plan_environment(src_repo, head(src_repo), config(setup=[])).needed


def test_every_kind_at_the_root_gets_its_default_setup(tmp_path: Path) -> None:
    """A mixed repository (a Python service with a Node front end) gets both, in order."""
    repo = make_repo(
        tmp_path / "mixed",
        {"pyproject.toml": HATCH_PROJECT, "package.json": "{}", "package-lock.json": "{}"},
    )
    plan = plan_environment(repo, head(repo), config())
    assert (plan.kind, plan.kinds) == (ProjectKind.PYTHON, (ProjectKind.PYTHON, ProjectKind.NODE))
    assert plan.setup[0].startswith("uv venv ")
    assert plan.setup[-1] == 'npm ci && mv node_modules "$MERLIN_ENV/node_modules"'


def test_the_key_follows_the_cache_key_files_only(src_repo: Path) -> None:
    first = plan_environment(src_repo, head(src_repo), config()).key
    code_change = commit(src_repo, {"src/pkg/__init__.py": "VALUE = 2\n"})
    assert plan_environment(src_repo, code_change, config()).key == first
    dependency_change = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# more\n"})
    assert plan_environment(src_repo, dependency_change, config()).key != first
    glob = config(cache_key=["*.lock"])
    before = plan_environment(src_repo, head(src_repo), glob).key
    locked = commit(src_repo, {"deps.lock": "a==1\n"})
    assert plan_environment(src_repo, locked, glob).key != before


def test_the_key_files_are_read_in_one_git_process_as_rev_parse_would(src_repo: Path) -> None:
    from merlin_flow.workspace.environment import _key_files
    from merlin_flow.workspace.git import git

    wanted = ["pyproject.toml", "src/pkg/__init__.py", "src", "missing.txt", "a b ü.txt"]
    commit(src_repo, {"a b ü.txt": "odd name\n"})
    found = _key_files(src_repo, head(src_repo), wanted, set())
    for path in [*wanted[:3], wanted[4]]:
        assert found[path] == git("rev-parse", f"HEAD:{path}", cwd=src_repo)
    assert found["missing.txt"] is None
    assert list(found) == sorted(wanted)


def test_setup_runs_once_per_key_and_is_reused(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=COUNTING_SETUP)
    first = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    assert first is not None
    assert first.built
    again = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    assert again is not None
    assert not again.built
    assert again.path == first.path
    assert (first.path / "runs").read_text() == "run\n"
    assert (first.path / MARKER_FILE).is_file()


def test_concurrent_builds_of_one_key_run_setup_once(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=["sleep 0.5", *COUNTING_SETUP])
    results = []

    def build() -> None:
        results.append(ensure_environment(settings, cfg, src_repo, head(src_repo), "repo"))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(1 for r in results if r is not None and r.built) == 1
    path = results[0].path if results[0] else None
    assert path is not None
    assert (path / "runs").read_text() == "run\n"


def test_a_failed_setup_names_the_command_shows_its_output_and_keeps_nothing(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    cfg = config(setup=["echo building", "echo 'no such package: frobnicate' >&2; exit 3"])
    with pytest.raises(SetupFailed) as failure:
        ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    message = str(failure.value)
    assert "exited with code 3" in message
    assert "no such package: frobnicate" in message
    assert [p for p in settings.envs_dir.iterdir() if p.is_dir()] == []
    assert list((settings.worktrees_dir / "_setup").iterdir()) == []


def test_setup_sees_the_project_at_workspace_and_steps_see_their_own_worktree(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None
) -> None:
    """An install made by setup against /workspace resolves to each attempt's worktree."""
    cfg = config(setup=['mkdir -p "$MERLIN_ENV/bin"', "ln -s /workspace/src $MERLIN_ENV/code"])
    env = ensure_environment(settings, cfg, src_repo, head(src_repo), "repo")
    worktree = tmp_path / "attempt"
    worktree.mkdir()
    (worktree / "src").mkdir()
    (worktree / "src" / "marker").write_text("the attempt's code\n")
    box = confine(worktree, env, cfg)
    result = run_confined(["/bin/sh", "-c", "cat $MERLIN_ENV/code/marker"], box, cfg.sandbox, 10)
    assert result.output_tail == "the attempt's code\n"


def test_a_build_for_dependency_files_a_step_changed_gets_no_network(
    src_repo: Path, settings: Settings, needs_bwrap: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build hook a step added reaches nothing, unless a --config file allows it.

    The listener stands for the worker's proxy: the base commit's setup has the outbound
    network, which reaches a proxy on the host's loopback that HTTPS_PROXY names.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    reach = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" "
        '&& touch "$MERLIN_ENV/reached"'
    )
    cfg = config(setup=[reach])
    base = head(src_repo)
    built = ensure_environment(settings, cfg, src_repo, base, "repo", trusted=base)
    assert built is not None
    assert (built.path / "reached").is_file()  # the user's own dependency files: network
    listener.accept()[0].close()

    hooked = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# a build hook\n"})
    with pytest.raises(SetupFailed) as refused:
        ensure_environment(settings, cfg, src_repo, hooked, "repo", trusted=base)
    assert "ran without the network" in str(refused.value)
    assert "attempt_network = true" in str(refused.value)
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing came

    allowed = config(setup=[reach])
    allowed.environment.attempt_network = True
    again = ensure_environment(settings, allowed, src_repo, hooked, "repo", trusted=base)
    assert again is not None
    assert (again.path / "reached").is_file()
    listener.close()


def test_a_repositorys_own_config_cannot_give_such_builds_the_network(tmp_path: Path) -> None:
    from merlin_flow.config import load_config
    from merlin_flow.errors import ConfigError

    repo = make_repo(tmp_path / "repo", {"merlin.toml": "[environment]\nattempt_network = true\n"})
    with pytest.raises(ConfigError, match=r"\[environment\] attempt_network"):
        load_config(repo)
    own = tmp_path / "mine.toml"
    own.write_text("[environment]\nattempt_network = true\n")
    assert load_config(repo, own).environment.attempt_network


# -- issue 45: what runs at build time, and what the worker takes of a build -----------------


def ignoring(repo: Path, *names: str) -> str:
    """``repo`` with a .gitignore of ``names`` committed: files setup may generate."""
    return commit(repo, {".gitignore": "".join(f"{name}\n" for name in names)})


def build_or_refusal(
    settings: Settings, cfg: MerlinConfig, repo: Path, base: str
) -> BuiltEnvironment | SetupFailed | None:
    """The environment of the job's base ``base``, or the refusal of its build."""
    try:
        return ensure_environment(settings, cfg, repo, base, "repo", trusted=base)
    except SetupFailed as refused:
        return refused


@pytest.mark.parametrize("link", ["file", "folder"])
def test_setup_cannot_make_the_worker_write_through_a_link_in_the_overlay(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None, link: str
) -> None:
    """A link setup plants where the worker keeps the generated files leads nowhere.

    The old worker copied ``gen.txt`` through ``.merlin-workspace/gen.txt`` (or through
    a linked ``.merlin-workspace``) onto the host file it names.
    """
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "gen.txt").write_text("precious\n")
    planted = (
        f'mkdir -p "$MERLIN_ENV/.merlin-workspace" && ln -s {victim}/gen.txt '
        '"$MERLIN_ENV/.merlin-workspace/gen.txt"'
        if link == "file"
        else f'ln -s {victim} "$MERLIN_ENV/.merlin-workspace"'
    )
    cfg = config(setup=[planted, "echo planted > /workspace/gen.txt"])
    base = ignoring(src_repo, "gen.txt")
    built = build_or_refusal(settings, cfg, src_repo, base)
    assert (victim / "gen.txt").read_text() == "precious\n"
    assert isinstance(built, SetupFailed)
    assert "`$MERLIN_ENV/.merlin-workspace`" in str(built)
    assert [p for p in settings.envs_dir.iterdir() if p.is_dir()] == []


def test_setup_cannot_make_the_worker_copy_a_host_file_into_worktrees(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None
) -> None:
    """A link in the overlay to a host file (``/proc/self/environ``...) is never read.

    Built by setup, the environment is refused; one already on disk with such a link (as
    the old worker left them) gives worktrees nothing through it.
    """
    secret = tmp_path / "secret.txt"
    secret.write_text("OPENAI_API_KEY=sk-host-only\n")
    plant = (
        f'mkdir -p "$MERLIN_ENV/.merlin-workspace" && '
        f'ln -s {secret} "$MERLIN_ENV/.merlin-workspace/leak.txt"'
    )
    cfg = config(setup=[plant])
    base = head(src_repo)
    built = build_or_refusal(settings, cfg, src_repo, base)
    if isinstance(built, BuiltEnvironment):
        git(src_repo, "worktree", "add", "-q", "--detach", str(tmp_path / "first"), base)
        prepare_worktree(built, tmp_path / "first")
        assert not (tmp_path / "first" / "leak.txt").exists()
    assert isinstance(built, SetupFailed)

    old = tmp_path / "old-env"
    (old / ".merlin-workspace" / "sub").mkdir(parents=True)
    (old / MARKER_FILE).write_text("{}\n")
    (old / ".merlin-workspace" / "leak.txt").symlink_to(secret)
    (old / ".merlin-workspace" / "sub" / "leak.txt").symlink_to(secret)
    (old / ".merlin-workspace" / "kept.txt").write_text("generated\n")
    worktree = tmp_path / "wt"
    worktree.mkdir()
    prepare_worktree(BuiltEnvironment(old, built=False), worktree)
    assert not (worktree / "leak.txt").exists()
    assert not (worktree / "sub" / "leak.txt").exists()
    assert (worktree / "kept.txt").read_text() == "generated\n"


@pytest.mark.parametrize("name", ["build", "node_modules", "pyvenv.cfg"])
def test_an_environment_setup_linked_what_the_sandbox_binds_in_is_refused(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None, name: str
) -> None:
    """``build``, ``node_modules`` and ``pyvenv.cfg`` made links to host paths: refused.

    With the old worker, a step then wrote the linked folder at ``/merlin/build``, read it
    at ``/workspace/node_modules``, or read the folder a linked ``pyvenv.cfg`` named.
    """
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_text("the user's file\n")
    (victim / "cfg").write_text(f"home = {victim}/bin\n")
    target = victim / "cfg" if name == "pyvenv.cfg" else victim
    cfg = config(setup=[f'rm -rf "$MERLIN_ENV/{name}" && ln -s {target} "$MERLIN_ENV/{name}"'])
    built = build_or_refusal(settings, cfg, src_repo, head(src_repo))
    if isinstance(built, BuiltEnvironment):
        worktree = tmp_path / "attempt"
        worktree.mkdir()
        (worktree / "package.json").write_text("{}\n")  # a Node project: node_modules bound
        (worktree / "Cargo.toml").write_text("")  # a Rust one: the build cache bound
        box = confine(worktree, built, cfg)
        script = (
            "echo written > /merlin/build/planted; "
            f"cat /workspace/node_modules/secret {victim}/secret"
        )
        result = run_confined(["/bin/sh", "-c", script], box, cfg.sandbox, 30)
        assert not (victim / "planted").exists()
        assert "the user's file" not in result.output_tail
    assert isinstance(built, SetupFailed)
    assert f"`$MERLIN_ENV/{name}` as a symbolic link" in str(built)


def test_a_commit_with_the_bases_key_gets_the_environment_built_from_the_base(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None
) -> None:
    """Build code outside the key files is the base's, even on a machine that never saw it.

    The attempt changes ``build.sh`` (no key file) to plant a ``conftest.py``. A verify
    worker with an empty ``MERLIN_HOME`` checks out only the attempt's commit; the old
    worker built from it, with the network, and a later job at the base got its plant.
    """
    cfg = config(setup=["sh /workspace/build.sh"])
    base = commit(src_repo, {"build.sh": 'echo base > "$MERLIN_ENV/built-by"\n'})
    attempt = commit(
        src_repo,
        {
            ".gitignore": "conftest.py\n",
            "build.sh": 'echo attempt > "$MERLIN_ENV/built-by"\n'
            "echo 'import os' > /workspace/conftest.py\n",
        },
    )
    assert plan_environment(src_repo, attempt, cfg).key == plan_environment(src_repo, base, cfg).key
    verify = ensure_environment(settings, cfg, src_repo, attempt, "repo", trusted=base)
    assert verify is not None
    assert verify.built
    assert (verify.path / "built-by").read_text() == "base\n"
    assert verify.network != describe(False)  # the base's own build: the network

    later = ensure_environment(settings, cfg, src_repo, base, "repo", trusted=base)
    assert later is not None
    assert (later.path, later.built) == (verify.path, False)
    worktree = tmp_path / "later"
    git(src_repo, "worktree", "add", "-q", "--detach", str(worktree), base)
    prepare_worktree(later, worktree)
    assert not (worktree / "conftest.py").exists()


def test_an_environment_a_step_changed_the_key_of_is_that_commits_alone(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    """Built offline from the attempt's tree, it is never found by another commit or job.

    The old worker stored it under the key alone: another attempt with the same
    dependency change, and a later job whose base has it (the branch merged), reused it.
    """
    cfg = config(setup=['cp /workspace/build.sh "$MERLIN_ENV/built-from"'])
    base = commit(src_repo, {"build.sh": "base\n"})
    changed = HATCH_PROJECT + "\n# a new dependency\n"
    first = commit(src_repo, {"pyproject.toml": changed, "build.sh": "first attempt\n"})
    built = ensure_environment(settings, cfg, src_repo, first, "repo", trusted=base)
    assert built is not None
    assert built.built
    assert built.network == describe(False)
    assert (built.path / "built-from").read_text() == "first attempt\n"
    again = ensure_environment(settings, cfg, src_repo, first, "repo", trusted=base)
    assert again is not None
    assert (again.path, again.built) == (built.path, False)  # its own verify reuses it

    git(src_repo, "checkout", "-q", base)
    second = commit(src_repo, {"pyproject.toml": changed, "build.sh": "second attempt\n"})
    other = ensure_environment(settings, cfg, src_repo, second, "repo", trusted=base)
    assert other is not None
    assert other.built
    assert other.path != built.path
    assert (other.path / "built-from").read_text() == "second attempt\n"

    merged = ensure_environment(settings, cfg, src_repo, first, "repo", trusted=first)
    assert merged is not None
    assert merged.built  # a later job on the merged commit: built again, with the network
    assert merged.path not in (built.path, other.path)
    assert merged.network != describe(False)


TINY_WHEEL = "tinypkg-1.0-py3-none-any.whl"


def tiny_index(root: Path) -> Path:
    """A one-package simple index (PEP 503) in ``root``: ``tinypkg`` 1.0, ``VALUE = 42``."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n" for path, data in files.items())
    (root / "files").mkdir(parents=True)
    wheel = root / "files" / TINY_WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(
            "tinypkg-1.0.dist-info/RECORD", record + "tinypkg-1.0.dist-info/RECORD,,\n"
        )
    (root / "simple" / "tinypkg").mkdir(parents=True)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    link = f'<a href="../../files/{TINY_WHEEL}#sha256={sha}">{TINY_WHEEL}</a>'
    (root / "simple" / "tinypkg" / "index.html").write_text(f"<html><body>{link}</body></html>")
    return root


def test_a_build_without_the_network_installs_from_the_caches_and_writes_none_of_them(
    src_repo: Path, settings: Settings, tmp_path: Path, needs_bwrap: None
) -> None:
    """uv, offline, finds what the shared cache holds; what the build writes stays its own.

    The old worker bound the shared caches read-write into every build: the model's build
    code could plant there what every later setup on the machine (any repository, with the
    network) would use.
    """
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    index = tiny_index(tmp_path / "index")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    cache = settings.uv_cache
    try:  # the shared cache as an earlier build with the network left it
        venv = tmp_path / "populate"
        run = {"env": {**os.environ, "UV_CACHE_DIR": str(cache)}, "check": True}
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], **run)
        install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python")]
        subprocess.run([*install, "--index-url", url, "tinypkg"], **run)
    finally:
        server.shutdown()
        server.server_close()
    before = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    setup = [
        f'uv venv --quiet --allow-existing --python {interpreter()} "$MERLIN_ENV"',
        f"uv pip install --quiet --index-url {url} tinypkg",
        'echo planted > "$UV_CACHE_DIR/planted"; echo planted > "$npm_config_cache/planted"',
    ]
    cfg = config(setup=setup)
    base = head(src_repo)
    changed = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# tinypkg\n"})
    built = ensure_environment(settings, cfg, src_repo, changed, "repo", trusted=base)
    assert built is not None
    assert built.network == describe(False)
    box = confine(src_repo, built, cfg)
    result = run_confined(
        ["python", "-c", "import tinypkg; print(tinypkg.VALUE)"], box, cfg.sandbox, 30
    )
    assert result.output_tail.strip() == "42", result.output_tail
    assert not (cache / "planted").exists()
    assert not (settings.npm_cache / "planted").exists()
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == before
    assert list(setup_checkouts(settings).iterdir()) == []  # the private copies are gone


def test_a_marker_setup_writes_is_never_taken_for_a_ready_environment(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    """While setup runs, another step of the key waits for the build: it never takes the
    folder setup is still writing (its own marker in it) for a ready environment."""
    started = 'touch "$MERLIN_ENV/started"; echo \'{}\' > "$MERLIN_ENV/.merlin-env.json"'
    cfg = config(setup=[started, "sleep 1"])
    results: list[object] = []

    def build() -> None:
        results.append(build_or_refusal(settings, cfg, src_repo, head(src_repo)))

    first = threading.Thread(target=build)
    first.start()
    plan = plan_environment(src_repo, head(src_repo), cfg, str(src_repo))
    deadline = time.monotonic() + 30
    while not any(settings.envs_dir.glob(f"*-{plan.key}/started")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    build()  # meanwhile
    first.join()
    assert [type(result) for result in results] == [SetupFailed, SetupFailed]


def test_the_build_of_a_steps_dependency_change_writes_no_shared_cache_even_with_the_network(
    src_repo: Path, settings: Settings, needs_bwrap: None
) -> None:
    """``attempt_network`` gives the model's build the network, never the shared caches."""
    plant = 'echo planted > "$UV_CACHE_DIR/planted"; echo planted > "$npm_config_cache/planted"'
    cfg = config(setup=[plant])
    cfg.environment.attempt_network = True
    base = head(src_repo)
    changed = commit(src_repo, {"pyproject.toml": HATCH_PROJECT + "\n# a build hook\n"})
    built = ensure_environment(settings, cfg, src_repo, changed, "repo", trusted=base)
    assert built is not None
    assert built.network != describe(False)
    assert not (settings.uv_cache / "planted").exists()
    assert not (settings.npm_cache / "planted").exists()
    again = ensure_environment(settings, cfg, src_repo, base, "repo", trusted=base)
    assert again is not None
    assert (settings.uv_cache / "planted").is_file()  # the base's own build: the shared cache


def test_the_cache_copies_a_killed_build_leaves_are_swept_with_its_checkout(
    settings: Settings,
) -> None:
    """They lie beside the build's checkout, named for its environment: a sweep that finds
    no build holding that environment's lock removes them."""
    from merlin_flow.workspace.worktree_cleanup import clear_setups

    left = setup_checkouts(settings) / "repo-0123456789abcdef-89abcdef.cache"
    (left / "uv").mkdir(parents=True)
    (left / "uv" / "CACHEDIR.TAG").write_text("")
    assert clear_setups(settings) == [left]
    assert not left.exists()
