"""`merlin ui` refuses to serve an open dashboard beyond loopback (exit code 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.cli.app import app


def test_a_public_address_without_a_token_is_refused(
    merlin_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MERLIN_UI_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["ui", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "not a loopback address: set MERLIN_UI_TOKEN" in " ".join(result.output.split())


def test_a_short_token_is_refused(merlin_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERLIN_UI_TOKEN", "abc")
    result = CliRunner().invoke(app, ["ui"])
    assert result.exit_code == 2
    assert "at least 16 characters" in result.output
