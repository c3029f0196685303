"""`merlin doctor`: each check through the real CLI, as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app
from tests.conftest import make_repo

SCRIPTED = '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n'


def doctor(*args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = CliRunner().invoke(app, ["doctor", "--json", *args])
    checks = {check["name"]: check for check in json.loads(result.output)}
    return result.exit_code, checks


def test_a_scripted_setup_passes(merlin_home: Path, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {"merlin.toml": SCRIPTED, "local.yaml": "rules: []\n", "pyproject.toml": ""},
    )
    code, checks = doctor("--repo", str(repo))
    assert code == 0, checks
    assert checks["sandbox"]["verdict"] == "ok"
    assert checks["tier local"]["verdict"] == "ok"
    assert checks["database"]["verdict"] == "ok"
    assert checks["broker"]["verdict"] == "ok"
    assert checks["workers"]["verdict"] == "warn"  # the embedded broker cannot say
    assert "uv venv" in checks["environment"]["detail"]


def test_it_lists_the_configuration_files_read_in_order(
    merlin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "etc" / "merlin.toml"
    system.parent.mkdir()
    system.write_text("[limits]\nmax_turns = 5\n")
    monkeypatch.setenv("MERLIN_SYSTEM_CONFIG", str(system))
    repo = make_repo(tmp_path / "repo", {"merlin.toml": SCRIPTED, "local.yaml": "rules: []\n"})
    code, checks = doctor("--repo", str(repo))
    lines = checks["config"]["detail"].splitlines()
    assert [line.split(" ")[:2] for line in lines] == [
        ["1.", "defaults"],
        ["2.", "system"],
        ["3.", "repository"],
        ["not", "read:"],
    ]
    assert code == 0, checks
    assert lines[1].endswith(str(system))
    assert lines[2].endswith(str(repo / "merlin.toml"))
    assert lines[3] == f"not read: user {merlin_home / 'merlin.toml'} (absent)"
    ci = tmp_path / "ci.toml"  # MERLIN_CONFIG stands for --config
    ci.write_text(SCRIPTED.replace("local.yaml", str(repo / "local.yaml")))
    monkeypatch.setenv("MERLIN_CONFIG", str(ci))
    _, checks = doctor("--repo", str(repo))
    assert f"3. --config {ci}" in checks["config"]["detail"]
    assert "(--config replaces it)" in checks["config"]["detail"]


def test_a_tier_without_its_key_fails_and_says_what_to_set(
    merlin_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = tmp_path / "merlin.toml"
    config.write_text('[[tiers]]\nname = "fast"\nmodel = "openai/gpt-4o-mini"\n')
    code, checks = doctor("--config", str(config))
    assert code == 1
    assert checks["tier fast"]["verdict"] == "fail"
    assert "OPENAI_API_KEY" in checks["tier fast"]["detail"]
    assert checks["tier fast"]["fix"]


def test_sandbox_mode_none_is_a_warning(merlin_home: Path, tmp_path: Path) -> None:
    (tmp_path / "local.yaml").write_text("rules: []\n")
    config = tmp_path / "merlin.toml"
    config.write_text(SCRIPTED + '[sandbox]\nmode = "none"\n')
    code, checks = doctor("--config", str(config))
    assert code == 0
    assert checks["sandbox"]["verdict"] == "warn"
    assert "unconfined" in checks["sandbox"]["detail"]


def test_a_server_tier_of_unknown_price_is_a_warning(merlin_home: Path, tmp_path: Path) -> None:
    from tests.model_server import ModelServer

    with ModelServer() as server:
        config = tmp_path / "merlin.toml"
        tier = f'[[tiers]]\nname = "own"\nmodel = "openai/smollm2"\napi_base = "{server.url}"\n'
        config.write_text(tier)
        code, checks = doctor("--config", str(config))
        assert code == 0
        assert checks["tier own"]["verdict"] == "warn"
        assert server.url in checks["tier own"]["detail"]
        assert "price is unknown" in checks["tier own"]["detail"]
        config.write_text(tier + "price_in = 0.0\nprice_out = 0.0\n")
        code, checks = doctor("--config", str(config))
        assert checks["tier own"]["verdict"] == "ok"


def test_the_broker_checks_read_the_probe_they_are_given() -> None:
    from merlin_flow.jobs.doctor import Verdict, broker_checks

    down = broker_checks(lambda: ("ConnectionRefusedError: [Errno 111]", None))
    assert [(c.name, c.verdict) for c in down] == [("broker", Verdict.FAIL)]
    assert down[0].fix == "check MERLIN_BROKER_URL and the server"
    counts = broker_checks(lambda: (None, {"llm": 1, "control": 1, "verify": 0}))
    assert [(c.name, c.verdict) for c in counts] == [
        ("broker", Verdict.OK),
        ("queue llm", Verdict.OK),
        ("queue control", Verdict.OK),
        ("queue verify", Verdict.WARN),
    ]
    assert counts[-1].fix == "start `merlin worker -Q verify` (see Procfile)"


def test_a_rust_repo_runs_its_toolchain_in_the_sandbox(merlin_home: Path, tmp_path: Path) -> None:
    from merlin_flow.workspace.exit_commands import ProjectKind
    from merlin_flow.workspace.toolchains import find_toolchain

    if find_toolchain(ProjectKind.RUST) is None:
        pytest.skip("no Rust toolchain (cargo) on this machine")
    repo = make_repo(
        tmp_path / "repo",
        {"merlin.toml": SCRIPTED, "local.yaml": "rules: []\n", "Cargo.toml": "[package]\n"},
    )
    code, checks = doctor("--repo", str(repo))
    assert checks["toolchain rust"]["verdict"] == "ok", checks["toolchain rust"]
    assert "cargo" in checks["toolchain rust"]["detail"]
    assert "toolchain python" not in checks  # the environment check covers Python
    assert code == 0, checks


def test_a_toolchain_not_found_fails_with_where_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.config import load_config
    from merlin_flow.jobs import doctor as doctor_module

    monkeypatch.setattr(doctor_module, "find_toolchain", lambda kind: None)
    for marker in ("Cargo.toml", "go.mod", "pyproject.toml"):
        (tmp_path / marker).write_text("")
    checks = doctor_module.toolchain_checks(tmp_path, load_config())
    assert [(c.name, c.verdict) for c in checks] == [
        ("toolchain rust", doctor_module.Verdict.FAIL),
        ("toolchain go", doctor_module.Verdict.FAIL),
    ]
    assert "no `cargo` found" in checks[0].detail
    assert checks[0].fix is not None
    assert "rustup" in checks[0].fix
    assert "~/.cargo/bin" in checks[0].fix


def test_a_toolchain_out_of_the_sandboxs_reach_fails_with_the_reason(tmp_path: Path) -> None:
    from merlin_flow.config import load_config
    from merlin_flow.jobs.doctor import Verdict, toolchain_check
    from merlin_flow.workspace.exit_commands import ProjectKind
    from merlin_flow.workspace.sandbox import sandbox_problem
    from merlin_flow.workspace.toolchains import Toolchain

    if sandbox_problem():
        pytest.skip(str(sandbox_problem()))
    cargo = tmp_path / "bin" / "cargo"  # found, but nothing of it bound
    cargo.parent.mkdir()
    cargo.write_text("#!/bin/sh\necho cargo 1.0\n")
    cargo.chmod(0o755)
    found = Toolchain(ProjectKind.RUST, cargo, "system PATH")
    check = toolchain_check(ProjectKind.RUST, load_config(), found)
    assert check.verdict is Verdict.FAIL
    assert "exit code" in check.detail
    assert "execvp cargo" in check.detail
    assert check.fix is not None
    assert str(cargo) in check.fix
    bound = Toolchain(ProjectKind.RUST, cargo, "system PATH", (str(cargo.parent),), (cargo.parent,))
    check = toolchain_check(ProjectKind.RUST, load_config(), bound)
    assert (check.verdict, check.detail) == (Verdict.OK, f"cargo 1.0 (system PATH: {cargo})")


def test_a_toolchain_check_without_a_sandbox_says_to_fix_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from merlin_flow.config import load_config
    from merlin_flow.jobs import doctor as doctor_module
    from merlin_flow.workspace.exit_commands import ProjectKind
    from merlin_flow.workspace.toolchains import Toolchain

    monkeypatch.setattr(doctor_module, "sandbox_problem", lambda: "bubblewrap is not installed")
    found = Toolchain(ProjectKind.GO, Path("/usr/bin/go"), "system PATH")
    check = doctor_module.toolchain_check(ProjectKind.GO, load_config(), found)
    assert check.verdict is doctor_module.Verdict.FAIL
    assert check.fix == "fix the sandbox check first"
