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
