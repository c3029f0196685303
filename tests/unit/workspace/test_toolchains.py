"""Toolchains found where users install them, and what the sandbox is given for them.

Fake homes hold fake programs (shell scripts) laid out as rustup, nvm, fnm, volta, Go,
asdf and mise lay them out; ``environ`` is explicit, its PATH without them unless a
test puts them there. The last tests run real programs in the real sandbox.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from merlin_flow.tool_config import Sandbox
from merlin_flow.workspace.exit_commands import ProjectKind
from merlin_flow.workspace.sandbox import Confinement, run_confined
from merlin_flow.workspace.toolchains import (
    PROGRAMS,
    VERSION_COMMANDS,
    Toolchain,
    find_toolchain,
    toolchain_mounts,
)
from tests.conftest import require_bwrap

RUST, NODE, GO = ProjectKind.RUST, ProjectKind.NODE, ProjectKind.GO


def program(path: Path, says: str = "fake") -> Path:
    """An executable shell script at ``path`` that prints ``says``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho {says} "$@"\n')
    path.chmod(0o755)
    return path


def link(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """A PATH that holds no toolchain."""
    (tmp_path / "empty").mkdir()
    return {"PATH": str(tmp_path / "empty")}


def rustup(home: Path) -> Path:
    """~/.cargo/bin as rustup makes it: proxies linked to rustup; ~/.rustup beside it."""
    bin_dir = home / ".cargo" / "bin"
    program(bin_dir / "rustup")
    for name in ("cargo", "rustc"):
        link(bin_dir / name, "rustup")
    (home / ".cargo" / "credentials.toml").write_text('[registry]\ntoken = "secret"\n')
    (home / ".rustup" / "toolchains" / "stable-x86_64-unknown-linux-gnu" / "bin").mkdir(
        parents=True
    )
    return bin_dir


def nvm_node(home: Path, version: str) -> Path:
    """A node of nvm's, with npm a symlink into ../lib as nvm installs it."""
    root = home / ".nvm" / "versions" / "node" / version
    program(root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js", f"npm-of-{version}")
    link(root / "bin" / "npm", "../lib/node_modules/npm/bin/npm-cli.js")
    return program(root / "bin" / "node", version)


def assert_safe(found: Toolchain, home: Path) -> None:
    for folder in found.read_only:
        assert folder != Path("/")
        assert not home.is_relative_to(folder), folder
        assert not folder.is_relative_to("/usr")


def test_rustup_binds_its_bin_and_rustup_home_never_the_cargo_home(
    home: Path, environ: dict[str, str]
) -> None:
    bin_dir = rustup(home)
    found = find_toolchain(RUST, home, environ)
    assert found == Toolchain(
        RUST,
        bin_dir / "cargo",
        "rustup (~/.cargo, ~/.rustup)",
        (str(bin_dir),),
        (bin_dir, home / ".rustup"),
        {"RUSTUP_HOME": str(home / ".rustup")},
    )
    assert home / ".cargo" not in found.read_only  # it holds credentials.toml
    assert "CARGO_HOME" not in found.variables
    assert_safe(found, home)


def test_rustup_follows_cargo_home_and_rustup_home(
    home: Path, environ: dict[str, str], tmp_path: Path
) -> None:
    bin_dir = program(tmp_path / "opt" / "cargo" / "bin" / "cargo").parent
    (tmp_path / "opt" / "rustup").mkdir()
    env = {
        **environ,
        "CARGO_HOME": str(bin_dir.parent),
        "RUSTUP_HOME": str(tmp_path / "opt" / "rustup"),
    }
    found = find_toolchain(RUST, home, env)
    assert found is not None
    assert found.read_only == (bin_dir, tmp_path / "opt" / "rustup")
    assert found.variables == {"RUSTUP_HOME": str(tmp_path / "opt" / "rustup")}


def test_a_path_hit_in_the_cargo_bin_is_rustup(home: Path) -> None:
    bin_dir = rustup(home)
    env = {"PATH": str(bin_dir), "RUSTUP_TOOLCHAIN": "nightly"}
    found = find_toolchain(RUST, home, env)
    assert found is not None
    assert found.source == "rustup (~/.cargo, ~/.rustup)"
    assert found.read_only == (bin_dir, home / ".rustup")
    assert found.variables == {"RUSTUP_HOME": str(home / ".rustup"), "RUSTUP_TOOLCHAIN": "nightly"}


def test_rustup_proxies_without_a_bindable_rustup_home_are_passed_over(
    home: Path, environ: dict[str, str]
) -> None:
    rustup(home)
    assert find_toolchain(RUST, home, {**environ, "RUSTUP_HOME": str(home)}) is None  # ~ itself
    assert find_toolchain(RUST, home, {**environ, "RUSTUP_HOME": str(home / "gone")}) is None


def test_nvm_gives_the_newest_version_with_its_install_root(
    home: Path, environ: dict[str, str]
) -> None:
    for version in ("v9.0.0", "v18.19.0", "v20.11.1"):
        nvm_node(home, version)
    root = home / ".nvm" / "versions" / "node" / "v20.11.1"
    found = find_toolchain(NODE, home, environ)
    assert found == Toolchain(NODE, root / "bin" / "node", "nvm", (str(root / "bin"),), (root,), {})
    older = home / ".nvm" / "versions" / "node" / "v18.19.0" / "bin"
    chosen = find_toolchain(NODE, home, {**environ, "NVM_BIN": str(older)})
    assert chosen is not None
    assert chosen.program == older / "node"


def test_fnm_volta_and_their_variables(home: Path, environ: dict[str, str]) -> None:
    installation = home / ".local" / "share" / "fnm" / "node-versions" / "v20.1.0" / "installation"
    program(installation / "bin" / "node")
    found = find_toolchain(NODE, home, environ)
    assert found is not None
    assert found.source == "fnm"
    assert found.read_only == (installation,)
    assert found.path == (str(installation / "bin"),)

    volta = home / "volta-home"
    program(volta / "bin" / "volta-shim")
    link(volta / "bin" / "node", "volta-shim")
    found = find_toolchain(NODE, home, {**environ, "VOLTA_HOME": str(volta)})
    assert found is not None
    assert found.source == "fnm"
    shutil.rmtree(home / ".local")
    found = find_toolchain(NODE, home, {**environ, "VOLTA_HOME": str(volta)})
    assert found == Toolchain(
        NODE,
        volta / "bin" / "node",
        "volta",
        (str(volta / "bin"),),
        (volta,),
        {"VOLTA_HOME": str(volta)},
    )


def test_go_places_in_order_and_no_goroot_set(home: Path, environ: dict[str, str]) -> None:
    for version in ("go1.21.5", "go1.22.0", "go1.9"):
        program(home / "sdk" / version / "bin" / "go")
    found = find_toolchain(GO, home, environ)
    newest = home / "sdk" / "go1.22.0"
    assert found == Toolchain(
        GO, newest / "bin" / "go", "~/sdk", (str(newest / "bin"),), (newest,), {}
    )
    program(home / "go" / "bin" / "go")
    found = find_toolchain(GO, home, environ)
    assert found is not None
    assert found.source == "~/go"
    assert found.read_only == (home / "go",)
    goroot = program(home / "goroot" / "bin" / "go").parent.parent
    found = find_toolchain(GO, home, {**environ, "GOROOT": str(goroot)})
    assert found is not None
    assert found.source == "GOROOT"
    assert found.read_only == (goroot,)
    assert found.variables == {}


def test_asdf_and_mise_shims_count_only_for_their_own_programs(
    home: Path, environ: dict[str, str]
) -> None:
    program(home / ".asdf" / "bin" / "asdf")
    program(home / ".asdf" / "shims" / "node")
    assert find_toolchain(RUST, home, environ) is None  # no shim for cargo
    found = find_toolchain(NODE, home, environ)
    asdf = home / ".asdf"
    assert found == Toolchain(
        NODE,
        asdf / "shims" / "node",
        "asdf",
        (str(asdf / "shims"), str(asdf / "bin")),
        (asdf,),
        {"ASDF_DATA_DIR": str(asdf), "ASDF_DIR": str(asdf)},
    )

    mise = home / ".local" / "share" / "mise"
    binary = program(home / ".local" / "bin" / "mise")
    link(mise / "shims" / "cargo", str(binary))
    found = find_toolchain(RUST, home, environ)
    assert found is not None
    assert found.source == "mise"
    assert found.path == (str(mise / "shims"),)
    assert set(found.read_only) == {mise, home / ".local" / "bin"}  # never ~/.local whole
    assert found.variables == {"MISE_DATA_DIR": str(mise)}
    assert_safe(found, home)


def test_path_comes_first(home: Path, tmp_path: Path) -> None:
    nvm_node(home, "v20.11.1")
    on_path = program(tmp_path / "tools" / "bin" / "node")
    found = find_toolchain(NODE, home, {"PATH": str(on_path.parent)})
    assert found is not None
    assert found.source == "system PATH"
    assert found.program == on_path
    assert found.path == (str(on_path.parent),)
    assert found.read_only == (tmp_path / "tools",)  # its install root holds its bin
    old = nvm_node(home, "v18.19.0")  # an older nvm version on PATH beats the newest
    found = find_toolchain(NODE, home, {"PATH": str(old.parent)})
    assert found is not None
    assert (found.source, found.program) == ("nvm", old)


def test_a_program_in_the_home_never_binds_the_home(home: Path, environ: dict[str, str]) -> None:
    cargo = program(home / "bin" / "cargo")
    found = find_toolchain(RUST, home, {"PATH": str(cargo.parent)})
    assert found is not None
    assert found.read_only == (home / "bin",)
    assert_safe(found, home)
    cargo.rename(home / "cargo")
    assert find_toolchain(RUST, home, {"PATH": str(home)}) is None


def test_a_folder_holding_secrets_is_never_bound(home: Path, tmp_path: Path) -> None:
    node = program(tmp_path / "tools" / "bin" / "node")
    (node.parent / ".netrc").write_text("machine x password y\n")
    assert find_toolchain(NODE, home, {"PATH": str(node.parent)}) is None
    (node.parent / ".netrc").unlink()
    (tmp_path / "tools" / "credentials.toml").write_text("token\n")  # its install root
    found = find_toolchain(NODE, home, {"PATH": str(node.parent)})
    assert found is not None
    assert found.read_only == (node.parent,)
    hidden = program(home / ".ssh" / "bin" / "node")
    assert find_toolchain(NODE, home, {"PATH": str(hidden.parent)}) is None


def test_a_system_program_needs_nothing(home: Path) -> None:
    system = [
        k for k in PROGRAMS if Path("/usr/bin", PROGRAMS[k][0]).resolve().is_relative_to("/usr")
    ]
    system = [k for k in system if Path("/usr/bin", PROGRAMS[k][0]).exists()]
    if not system:
        pytest.skip("no toolchain in /usr/bin on this machine")
    for kind in system:
        found = find_toolchain(kind, home, {"PATH": "/usr/bin"})
        assert found == Toolchain(kind, Path("/usr/bin", PROGRAMS[kind][0]), "system PATH")


def test_mounts_are_merged_without_duplicates(tmp_path: Path) -> None:
    a = Toolchain(RUST, tmp_path / "a/bin/cargo", "x", ("/a/bin",), (tmp_path / "a",), {"A": "1"})
    b = Toolchain(
        NODE,
        tmp_path / "a/n/bin/node",
        "y",
        ("/a/bin", "/n/bin"),
        (tmp_path / "a" / "n", tmp_path / "b"),
        {"B": "2"},
    )
    assert toolchain_mounts([a, b]) == (
        ("/a/bin", "/n/bin"),
        (tmp_path / "a", tmp_path / "b"),
        {"A": "1", "B": "2"},
    )
    assert toolchain_mounts([]) == ((), (), {})


@pytest.fixture
def sandbox() -> Sandbox:
    require_bwrap()
    return Sandbox()


def run_in_sandbox(found: Toolchain, argv: tuple[str, ...], worktree: Path, config: Sandbox) -> str:
    path, read_only, variables = toolchain_mounts([found])
    confinement = Confinement(worktree, read_only=read_only, path=path, variables=variables)
    result = run_confined(argv, confinement, config, timeout=60)
    assert result.ok, result.output_tail
    return result.output_tail


def test_an_nvm_install_runs_in_the_sandbox_npm_included(
    home: Path, environ: dict[str, str], tmp_path: Path, sandbox: Sandbox
) -> None:
    nvm_node(home, "v20.11.1")
    found = find_toolchain(NODE, home, environ)
    assert found is not None
    (tmp_path / "worktree").mkdir()
    assert "v20.11.1" in run_in_sandbox(found, ("node",), tmp_path / "worktree", sandbox)
    # npm is a symlink into ../lib: reachable only through the install root
    assert "npm-of-v20.11.1" in run_in_sandbox(found, ("npm",), tmp_path / "worktree", sandbox)


@pytest.mark.parametrize("kind", list(VERSION_COMMANDS), ids=str)
def test_this_machines_toolchains_run_in_the_sandbox(
    kind: ProjectKind, tmp_path: Path, sandbox: Sandbox
) -> None:
    found = find_toolchain(kind)
    if found is None:
        pytest.skip(f"no {kind.value} toolchain ({PROGRAMS[kind][0]}) on this machine")
    output = run_in_sandbox(found, VERSION_COMMANDS[kind], tmp_path, sandbox)
    expected = {RUST: "cargo ", NODE: "v", GO: "go version go"}[kind]
    assert output.strip().startswith(expected), output
