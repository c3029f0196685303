"""The default setup of each kind of project, and the variables its commands run with."""

from __future__ import annotations

from pathlib import Path

import pytest

from merlin_flow.tool_config import Sandbox, SandboxMode
from merlin_flow.workspace.default_setup import (
    BUILD_INSIDE,
    confine_kinds,
    default_setup,
    key_material,
    kind_variables,
    prepare_folders,
    project_kinds,
)
from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.sandbox import Confinement, bwrap_arguments, run_confined
from tests.conftest import git, make_repo, require_bwrap

RUST, NODE, GO, PYTHON = ProjectKind.RUST, ProjectKind.NODE, ProjectKind.GO, ProjectKind.PYTHON


def setup_of(tmp_path: Path, files: dict[str, str]) -> list[str]:
    repo = make_repo(tmp_path / "repo", files)
    names = set(files) | {name.split("/", 1)[0] for name in files}
    return default_setup(project_kinds(names), repo, git(repo, "rev-parse", "HEAD"), names)


def test_kinds_are_every_marker_at_the_root_in_a_fixed_order() -> None:
    assert project_kinds(["go.mod", "package.json", "README.md"]) == (NODE, GO)
    assert project_kinds(["setup.cfg", "Cargo.toml"]) == (RUST, PYTHON)
    assert project_kinds(["README.md"]) == ()


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"Cargo.toml": ""}, "cargo fetch"),
        ({"Cargo.toml": "", "Cargo.lock": ""}, "cargo fetch --locked"),
        ({"package.json": "{}"}, "npm install && mv node_modules"),
        ({"package.json": "{}", "package-lock.json": "{}"}, "npm ci && mv"),
        ({"package.json": "{}", "pnpm-lock.yaml": ""}, "pnpm install --frozen-lockfile && mv"),
        ({"package.json": "{}", "yarn.lock": ""}, "else yarn install --immutable; fi && mv"),
        ({"go.mod": "module x\n"}, "go mod download"),
    ],
)
def test_each_kind_is_set_up_by_its_lock_file(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    (command,) = setup_of(tmp_path, files)
    assert command.startswith(expected) or expected in command


def test_a_vendored_go_module_downloads_nothing(tmp_path: Path) -> None:
    assert setup_of(tmp_path, {"go.mod": "module x\n", "vendor/modules.txt": ""}) == []


def test_commands_run_offline_and_setup_does_not() -> None:
    commands = kind_variables([RUST, GO, NODE], "/merlin/env", BUILD_INSIDE, setup=False)
    assert commands["CARGO_NET_OFFLINE"] == "true"
    assert commands["GOPROXY"] == "off"
    assert commands["npm_config_offline"] == "true"
    assert commands["CARGO_TARGET_DIR"] == "/merlin/build/target"
    assert commands["GOMODCACHE"] == "/merlin/env/gomod"
    setup = kind_variables([RUST, GO, NODE], "/merlin/env", "/merlin/env/build", setup=True)
    assert not {"CARGO_NET_OFFLINE", "GOPROXY", "npm_config_offline"} & set(setup)
    assert setup["CARGO_HOME"] == "/merlin/env/cargo"


def test_the_users_cargo_config_is_copied_and_keys_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cargo_home = tmp_path / "cargo-home"
    cargo_home.mkdir()
    (cargo_home / "credentials.toml").write_text('[registry]\ntoken = "secret"\n')
    monkeypatch.setenv("CARGO_HOME", str(cargo_home))
    assert key_material([RUST]) == {}
    (cargo_home / "config.toml").write_text('[source.crates-io]\nreplace-with = "mirror"\n')
    first = key_material([RUST])
    assert key_material([NODE]) == {}
    env = tmp_path / "env"
    prepare_folders(env, [RUST, GO])
    assert (env / "cargo" / "config.toml").read_text().startswith("[source.crates-io]")
    assert not (env / "cargo" / "credentials.toml").exists()
    assert (env / "gomod").is_dir()
    assert (env / "build").is_dir()
    (cargo_home / "config.toml").write_text("[net]\noffline = true\n")
    assert key_material([RUST]) != first


def test_commands_write_the_build_cache_and_read_node_modules(tmp_path: Path) -> None:
    env, worktree = tmp_path / "env", tmp_path / "worktree"
    (env / "node_modules").mkdir(parents=True)
    worktree.mkdir()
    box = confine_kinds(
        Confinement(worktree=worktree, env_dir=env), [NODE, RUST], Sandbox(), setup=False
    )
    assert (env / "build", BUILD_INSIDE) in box.writable
    assert box.worktree_binds == ((env / "node_modules", "/workspace/node_modules"),)
    args = bwrap_arguments(box, {})
    # node_modules is bound after the worktree, so it lands inside it.
    assert args.index("/workspace/node_modules") > args.index("/workspace")
    assert box.variables["CARGO_HOME"] == "/merlin/env/cargo"


def test_without_bwrap_the_host_paths_are_used(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.mkdir()
    none = Sandbox(mode=SandboxMode.NONE)
    box = confine_kinds(Confinement(worktree=tmp_path, env_dir=env), [GO], none, setup=False)
    assert box.variables["GOCACHE"] == f"{env}/build/go"
    assert box.variables["GOMODCACHE"] == f"{env}/gomod"
    assert (box.writable, box.worktree_binds) == ((), ())


def test_a_linked_build_cache_or_node_modules_is_never_bound(tmp_path: Path) -> None:
    """The sandbox binds them by their host paths: a link from setup is not followed.

    The old binds gave a step read-write access to any host folder at ``/merlin/build``,
    and read access to any at ``/workspace/node_modules``.
    """
    env, worktree, victim = tmp_path / "env", tmp_path / "worktree", tmp_path / "victim"
    for folder in (env, worktree, victim):
        folder.mkdir()
    (victim / "secret").write_text("the user's file\n")
    (env / "build").symlink_to(victim)
    (env / "node_modules").symlink_to(victim)
    box = confine_kinds(
        Confinement(worktree=worktree, env_dir=env), [NODE, RUST], Sandbox(), setup=False
    )
    assert [host for host, _ in box.writable if host.resolve() == victim] == []
    assert box.worktree_binds == ()
    require_bwrap()
    script = f"echo written > {BUILD_INSIDE}/planted; cat /workspace/node_modules/secret"
    result = run_confined(["/bin/sh", "-c", script], box, Sandbox(), 30)
    assert not (victim / "planted").exists()
    assert "the user's file" not in result.output_tail
