"""The sandbox's network: none, outbound only (through pasta), or the host's.

A command given the network (environment setup; a step with ``[sandbox] network =
true``) gets a network namespace of its own, joined to the outside by ``pasta``
(Debian's ``passt`` package): its connections leave from the worker's own sockets, so
they reach what the worker reaches beyond the machine (the internet, the package
registries), but not the host's ``127.0.0.1``, its addresses, the subnets on its links
(another container's Redis, Postgres or RabbitMQ) or its gateways. The launcher
(``merlin_flow.workspace.network_launcher``) sets that up in front of bwrap; this module
says whether it can run here (``outbound_problem``), what a command then gets
(``outbound``: where pasta cannot run, the host's network, with a warning) and builds
the launcher's command line (``launcher``).

``network = "host"`` (a ``--config`` file only) gives steps and setup the host's network
itself (``--share-net``), loopback included.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from merlin_flow.workspace import network_launcher
from merlin_flow.workspace.network_launcher import BLOCK_FD, DNS_ADDRESS, INFO_FD, RESOLV_FD

NETWORK_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "NPM_CONFIG_REGISTRY",
    "npm_config_registry",
    "GOPROXY",
    "GONOPROXY",
    "GOPRIVATE",
    "GONOSUMDB",
    "GOSUMDB",
    "GOINSECURE",
)
"""Proxy and index variables, given to commands with the network unless they hold credentials."""
PROBE_SECONDS = 30.0
PASTA_FIX = "install Debian's `passt` package (`apt-get install passt`), which has `pasta`"
OUTBOUND = (
    "outbound only, through pasta: the internet and package registries, not the host's "
    "127.0.0.1, its addresses or the subnets on its links"
)
HOST_NETWORK = "the host's network, its 127.0.0.1 (Redis, Postgres, RabbitMQ...) included"
LAUNCHER = Path(network_launcher.__file__)
PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
Service = tuple[int, str, int, str]
"""An address the sandbox may reach on one port: family, address, port, protocol."""
log = logging.getLogger(__name__)

_outbound: dict[str, str | None] = {}
"""What ``outbound_problem`` found (``problem``), and whether the fallback was logged."""


def pasta_path() -> str | None:
    """Where ``pasta`` is (on PATH, or in /usr/bin or /usr/sbin), or None."""
    system = (p for p in ("/usr/bin/pasta", "/usr/sbin/pasta") if os.access(p, os.X_OK))
    return shutil.which("pasta") or next(system, None)


def outbound_problem() -> str | None:
    """Why the outbound-only network cannot be given here, or None when it can.

    Tried once per process: pasta found, and attached to a sandbox that runs ``true``.
    """
    if "problem" not in _outbound:
        _outbound["problem"] = _probe()
    return _outbound["problem"]


def _probe() -> str | None:
    from merlin_flow.workspace.process import run_command

    pasta = pasta_path()
    if pasta is None:
        return f"pasta is not installed: {PASTA_FIX}"
    bwrap = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
    probe = [*launcher({}), *bwrap, "--proc", "/proc", *attach_options(), "--", "true"]
    result = run_command(probe, Path("/"), PROBE_SECONDS, {})
    if result.ok:
        return None
    lines = [line for line in result.output_tail.splitlines() if line.strip()]
    return f"pasta ({pasta}) cannot attach to a sandbox here: {lines[-1] if lines else 'no output'}"


def outbound(network: bool | str) -> bool | str:
    """The network a command asking for ``network`` gets: True, or "host" where pasta cannot run.

    The fallback is logged once per process (``fallback_warning``).
    """
    if network is not True or outbound_problem() is None:
        return network
    if "warned" not in _outbound:
        log.warning(fallback_warning())
        _outbound["warned"] = None
    return "host"


def fallback_warning() -> str:
    """The warning for commands that get the host's network because pasta cannot run."""
    return (
        f"warning: the outbound-only network is unavailable ({outbound_problem()}); commands "
        f"given the network get {HOST_NETWORK}"
    )


def describe(network: bool | str) -> str:
    """What a command asking for ``network`` (False, True or "host") reaches, in words."""
    if network is False:
        return "none: a network namespace of its own, with its own loopback only"
    if network == "host":
        return f'{HOST_NETWORK} (`[sandbox] network = "host"`)'
    return OUTBOUND if outbound(network) is True else fallback_warning()


def attach_options() -> list[str]:
    """The options bwrap needs for the launcher: its pid on fd 3, wait on fd 4, resolv.conf on 5."""
    options = ["--info-fd", str(INFO_FD), "--block-fd", str(BLOCK_FD)]
    etc = "/etc/resolv.conf"
    if os.path.islink(etc):  # often into /run, which is not mounted: bound at its target
        return [*options, "--ro-bind-data", str(RESOLV_FD), os.path.realpath(etc)]
    return [*options, "--ro-bind-data", str(RESOLV_FD), etc] if os.path.isfile(etc) else options


def launcher(env: Mapping[str, str]) -> list[str]:
    """The launcher's command line, in front of bwrap's, for a command that sees ``env``."""
    forwarded, opened = named_services(env)
    options = ["--runas", "0"] if os.getuid() == 0 else []  # as root, pasta drops to nobody
    options += ["--config-net", "--quiet", "--foreground", "--no-map-gw"]
    options += ["--dns-forward", DNS_ADDRESS, "-t", "none", "-u", "none", "-U", "none"]
    options += ["-T", ",".join(str(port) for port in sorted(forwarded)) or "none"]
    opened += [(socket.AF_INET, DNS_ADDRESS, 53, protocol) for protocol in ("tcp", "udp")]
    open_items = " ".join(
        f"{int(family)},{address},{port},{PROTOCOLS[protocol]}"
        for family, address, port, protocol in opened
    )
    pasta = pasta_path() or "pasta"
    script = [sys.executable, "-I", "-S", str(LAUNCHER)]
    return [*script, _resolv(), open_items, "--", pasta, *options, "--"]


def _resolv() -> str:
    """The sandbox's resolv.conf: ``DNS_ADDRESS``, then the host's search and options."""
    try:
        with open("/etc/resolv.conf", encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        lines = []
    kept = [line for line in lines if line.split()[:1] in (["search"], ["domain"], ["options"])]
    return "\n".join([f"nameserver {DNS_ADDRESS}", *kept]) + "\n"


def named_services(env: Mapping[str, str]) -> tuple[set[int], list[Service]]:
    """The proxies and indexes ``env``'s network variables name: loopback ports, others.

    One on the host's loopback (``http://127.0.0.1:3128``) has its port forwarded by pasta
    to the host's loopback; any other has each of its addresses let through, on its port
    alone (TCP).
    """
    forwarded: set[int] = set()
    opened: list[Service] = []
    for value in (env.get(name, "") for name in NETWORK_ENV):
        for url in re.findall(r"[A-Za-z][\w+.-]*://[^\s,|;]+", value):
            try:
                parts = urlsplit(url)
                host, port = parts.hostname, parts.port
            except ValueError:
                continue
            if not host:
                continue
            port = port or (443 if parts.scheme.lower() == "https" else 80)
            if host == "localhost" or _loopback(host):
                forwarded.add(port)
                continue
            try:
                found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            except (OSError, UnicodeError):
                continue  # unknown here: the command cannot look it up either
            opened += [(family, str(address[0]), port, "tcp") for family, *_, address in found]
    return forwarded, opened


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
