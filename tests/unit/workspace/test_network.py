"""The sandbox's network as the worker sees it: which one a command gets, and the fallback.

The namespace itself (what it reaches) is tested on real pasta in
``test_network_launcher.py``; these check the command lines, the fallback to the host's
network where pasta is missing, what setup's log and ``merlin doctor`` say, and that a
repository's own merlin.toml cannot ask for the host's network.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from merlin_flow.config import MerlinConfig, Tier, load_config
from merlin_flow.errors import ConfigError
from merlin_flow.settings import Settings
from merlin_flow.tool_config import Environment, Sandbox
from merlin_flow.workspace import network
from merlin_flow.workspace.environment import ensure_environment
from merlin_flow.workspace.network_launcher import DNS_ADDRESS
from merlin_flow.workspace.sandbox import Confinement, bwrap_arguments
from tests.conftest import git, make_repo, require_bwrap
from tests.unit.workspace.test_network_launcher import require_pasta

MISSING = f"pasta is not installed: {network.PASTA_FIX}"
SCRIPTED = '[[tiers]]\nname = "local"\nmodel = "scripted/local.yaml"\n'


@pytest.fixture
def no_pasta(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process finds no pasta: the outbound network is unavailable."""
    monkeypatch.setattr(network, "pasta_path", lambda: None)
    monkeypatch.setattr(network, "_outbound", {})


def test_loopback_proxies_are_forwarded_and_others_let_through_on_their_port() -> None:
    env = {
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "HTTP_PROXY": "http://localhost",
        "NO_PROXY": "localhost,127.0.0.1",
        "UV_INDEX": "internal=http://[::1]:3141/simple other=https://192.0.2.10/simple",
        "PIP_INDEX_URL": "http://[fd00::5]:8080/simple",
        "GOPROXY": "https://203.0.113.9:8443,direct",
        "LANG": "http://127.0.0.1:9999",  # not a network variable
    }
    forwarded, opened = network.named_services(env)
    assert forwarded == {3128, 80, 3141}
    assert sorted(opened) == sorted(
        [
            (socket.AF_INET, "192.0.2.10", 443, "tcp"),
            (socket.AF_INET6, "fd00::5", 8080, "tcp"),
            (socket.AF_INET, "203.0.113.9", 8443, "tcp"),
        ]
    )


def test_the_launcher_forwards_no_port_and_maps_no_gateway_by_default() -> None:
    argv = network.launcher({})
    assert argv[:4] == [sys.executable, "-I", "-S", str(network.LAUNCHER)]
    resolv, opened = argv[4], argv[5].split()
    assert resolv.startswith(f"nameserver {DNS_ADDRESS}\n")
    assert opened == [f"2,{DNS_ADDRESS},53,6", f"2,{DNS_ADDRESS},53,17"]
    pasta = argv[argv.index("--") + 1 : -1]
    assert argv[-1] == "--"
    for option in ("-t", "-u", "-T", "-U"):
        assert pasta[pasta.index(option) + 1] == "none"
    assert "--no-map-gw" in pasta
    assert "--foreground" in pasta
    assert pasta[pasta.index("--dns-forward") + 1] == DNS_ADDRESS
    proxied = network.launcher({"HTTPS_PROXY": "http://127.0.0.1:3128"})
    assert proxied[proxied.index("-T") + 1] == "3128"


def test_outbound_puts_the_launcher_before_bwrap_and_host_shares_the_network(
    tmp_path: Path,
) -> None:
    require_pasta()
    box = Confinement(worktree=tmp_path, network=True)
    args = bwrap_arguments(box, {})
    assert args[:4] == [sys.executable, "-I", "-S", str(network.LAUNCHER)]
    bwrap = args[args.index("bwrap") :]
    assert "--share-net" not in bwrap
    assert bwrap[bwrap.index("--info-fd") + 1] == "3"
    assert bwrap[bwrap.index("--block-fd") + 1] == "4"
    hosted = bwrap_arguments(Confinement(worktree=tmp_path, network="host"), {})
    assert hosted[0] == "bwrap"
    assert "--share-net" in hosted
    assert "--info-fd" not in hosted
    offline = bwrap_arguments(Confinement(worktree=tmp_path), {})
    assert offline[0] == "bwrap"
    assert "--share-net" not in offline


def test_without_pasta_commands_get_the_hosts_network_with_a_warning_once(
    tmp_path: Path, no_pasta: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=network.__name__):
        args = bwrap_arguments(Confinement(worktree=tmp_path, network=True), {})
        again = bwrap_arguments(Confinement(worktree=tmp_path, network=True), {})
    assert args[0] == "bwrap"
    assert "--share-net" in args
    assert again == args
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [network.fallback_warning()]
    assert MISSING in warnings[0]
    assert "127.0.0.1 (Redis, Postgres, RabbitMQ...) included" in warnings[0]
    assert network.describe(False).startswith("none")  # never the fallback's business


def test_a_repositorys_own_merlin_toml_cannot_ask_for_the_hosts_network(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"merlin.toml": '[sandbox]\nnetwork = "host"\n'})
    with pytest.raises(ConfigError, match=r"\[sandbox\] network would loosen the sandbox"):
        load_config(repo)
    own = tmp_path / "mine.toml"
    own.write_text('[sandbox]\nnetwork = "host"\n')
    assert load_config(repo, own).sandbox.network == "host"
    with pytest.raises(ValueError, match="network"):
        Sandbox.model_validate({"network": "everything"})


def config(setup: list[str], network_setting: bool | str = False) -> MerlinConfig:
    return MerlinConfig(
        tiers=[Tier(name="t", model="scripted/none.yaml")],
        environment=Environment(setup=setup),
        sandbox=Sandbox.model_validate({"network": network_setting}),
    )


def reach(port: int) -> str:
    return (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" "
        '&& touch "$MERLIN_ENV/reached" || true'
    )


def test_setup_says_which_network_it_had(tmp_path: Path) -> None:
    require_pasta()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    repo = make_repo(tmp_path / "repo", {"pyproject.toml": '[project]\nname = "p"\n'})
    settings = Settings(home=tmp_path / "home", uv_cache_dir=tmp_path / "uv")
    base = git(repo, "rev-parse", "HEAD")
    built = ensure_environment(settings, config([reach(listener.getsockname()[1])]), repo,
                               base, "repo", trusted=base)  # fmt: skip
    assert built is not None
    assert built.network == network.OUTBOUND
    log = built.path.with_name(built.path.name + ".log").read_text()
    assert log.splitlines()[0] == f"[merlin] network: {network.OUTBOUND}"
    assert not (built.path / "reached").exists()
    with pytest.raises(TimeoutError):
        listener.accept()
    listener.close()


def test_without_pasta_setup_falls_back_to_the_hosts_network_and_says_so(
    tmp_path: Path, no_pasta: None
) -> None:
    require_bwrap()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    repo = make_repo(tmp_path / "repo", {"pyproject.toml": '[project]\nname = "p"\n'})
    settings = Settings(home=tmp_path / "home", uv_cache_dir=tmp_path / "uv")
    base = git(repo, "rev-parse", "HEAD")
    built = ensure_environment(settings, config([reach(listener.getsockname()[1])]), repo,
                               base, "repo", trusted=base)  # fmt: skip
    assert built is not None
    assert built.network == network.fallback_warning()
    log = built.path.with_name(built.path.name + ".log").read_text()
    assert log.splitlines()[0] == f"[merlin] network: {network.fallback_warning()}"
    assert (built.path / "reached").exists()  # as the warning says
    listener.accept()[0].close()
    listener.close()


def doctor(repo: Path, *args: str) -> dict[str, dict[str, str]]:
    from merlin_flow.cli.app import app

    result = CliRunner().invoke(app, ["doctor", "--json", "--repo", str(repo), *args])
    return {check["name"]: check for check in json.loads(result.output)}


@pytest.fixture
def doctor_repo(tmp_path: Path, merlin_home: Path) -> Path:
    return make_repo(tmp_path / "repo", {"merlin.toml": SCRIPTED, "local.yaml": "rules: []\n"})


def test_doctor_names_the_setup_network(doctor_repo: Path) -> None:
    require_pasta()
    check = doctor(doctor_repo)["network"]
    assert check["verdict"] == "ok"
    assert check["detail"] == f"setup: {network.OUTBOUND}; steps: none"


def test_doctor_says_what_setup_reaches_without_pasta(doctor_repo: Path, no_pasta: None) -> None:
    require_bwrap()
    check = doctor(doctor_repo)["network"]
    assert check["verdict"] == "warn"
    assert check["detail"].startswith(MISSING)
    assert "setup gets the host's network, its 127.0.0.1" in check["detail"]
    assert check["fix"] == network.PASTA_FIX


def test_doctor_warns_of_the_hosts_network_chosen(doctor_repo: Path, tmp_path: Path) -> None:
    chosen = tmp_path / "ci.toml"
    tiers = SCRIPTED.replace("local.yaml", str(doctor_repo / "local.yaml"))
    chosen.write_text(f'{tiers}\n[sandbox]\nnetwork = "host"\n')
    check = doctor(doctor_repo, "--config", str(chosen))["network"]
    assert check["verdict"] == "warn"
    assert '`[sandbox] network = "host"`' in check["detail"]
