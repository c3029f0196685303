"""`merlin ui` refuses an open dashboard beyond loopback (exit code 2), answers its own Host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_an_allowed_host_that_is_no_host_is_refused(
    merlin_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MERLIN_UI_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["ui", "--allowed-host", "https://merlin.example.com/"])
    assert result.exit_code == 2
    assert "give a host name, NAME or NAME:PORT" in " ".join(result.output.split())


def test_the_dashboard_answers_its_address_and_the_allowed_hosts_only(
    merlin_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn
    from starlette.testclient import TestClient

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda asgi, **options: served.append((asgi, options)))
    monkeypatch.delenv("MERLIN_UI_TOKEN", raising=False)
    monkeypatch.setenv("MERLIN_UI_ALLOWED_HOSTS", "other.example:8443, ")
    args = ["ui", "--port", "8711", "--allowed-host", "merlin.example.com"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    ((asgi, options),) = served
    assert (options["host"], options["port"]) == ("127.0.0.1", 8711)
    answers = {
        url: TestClient(asgi, base_url=url).get("/login").status_code
        for url in ("http://127.0.0.1:8711", "http://localhost:8711", "https://merlin.example.com",
                    "https://other.example:8443", "http://127.0.0.1:8700",
                    "http://attacker.example:8711", "https://merlin.example.com:8443")
    }  # fmt: skip
    assert answers == {
        "http://127.0.0.1:8711": 200,
        "http://localhost:8711": 200,
        "https://merlin.example.com": 200,  # --allowed-host
        "https://other.example:8443": 200,  # MERLIN_UI_ALLOWED_HOSTS
        "http://127.0.0.1:8700": 403,  # not its port
        "http://attacker.example:8711": 403,
        "https://merlin.example.com:8443": 403,
    }
