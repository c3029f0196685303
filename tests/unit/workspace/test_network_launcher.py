"""The outbound network on real bwrap and pasta: the internet, not the host.

These attach pasta (Debian's `passt`) to real sandboxes. Without it they are skipped, or
fail when `CI` is set (CI installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from merlin_flow.tool_config import Sandbox
from merlin_flow.workspace import command_guard, network, network_launcher, process
from merlin_flow.workspace.network_launcher import DNS_ADDRESS, NETWORK_FAILED_EXIT_CODE
from merlin_flow.workspace.sandbox import Confinement, python_mounts, run_confined
from tests.conftest import require_bwrap

SECRET = "sk-network-test-0123456789abcdef"
PROBE = textwrap.dedent(
    """
    import json, socket, sys
    found = {}
    for target in sys.argv[1:]:
        host, _, port = target.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            found[target] = "reached"
        except OSError as exc:
            found[target] = f"refused: {type(exc).__name__}: {exc}"
    print(json.dumps(found))
    """
)


def require_pasta() -> None:
    """Skip the calling test without a pasta that attaches here; in CI, fail it."""
    require_bwrap()
    problem = network.outbound_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"pasta is required in CI: {problem}")
        pytest.skip(problem)


@pytest.fixture(autouse=True)
def _needs_pasta() -> None:
    require_pasta()


@pytest.fixture
def box(tmp_path: Path) -> Confinement:
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / "probe.py").write_text(PROBE)
    return Confinement(
        worktree=worktree,
        network=True,
        read_only=python_mounts(None),
        path=(str(Path(sys.executable).parent),),
    )


@pytest.fixture
def listeners() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A listener on the host's 127.0.0.1, and one on all its addresses (0.0.0.0)."""
    loopback = socket.create_server(("127.0.0.1", 0))
    everywhere = socket.create_server(("0.0.0.0", 0))
    for listener in (loopback, everywhere):
        listener.settimeout(0.5)
    yield loopback, everywhere
    loopback.close()
    everywhere.close()


def probe(box: Confinement, *targets: str, config: Sandbox | None = None) -> dict[str, str]:
    result = run_confined(["python3", "probe.py", *targets], box, config or Sandbox(), 60)
    assert result.exit_code == 0, result.output_tail
    found: dict[str, str] = json.loads(result.output_tail.strip().splitlines()[-1])
    return found


def host_address() -> str:
    """The host's own address on its default route (what 0.0.0.0 listeners answer on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("198.51.100.1", 9))  # no packet is sent
        address: str = udp.getsockname()[0]
        return address


def gateway() -> str | None:
    """The host's IPv4 default gateway, from /proc/net/route."""
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000" and int(fields[3], 16) & 2:
            return socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little"))
    return None


def nothing_came(*listeners: socket.socket) -> bool:
    for listener in listeners:
        try:
            listener.accept()[0].close()
            return False
        except TimeoutError:
            pass
    return True


def test_the_internet_is_reached_the_hosts_listeners_are_not(
    box: Confinement, listeners: tuple[socket.socket, socket.socket]
) -> None:
    loopback, everywhere = listeners
    mine, all_port = loopback.getsockname()[1], everywhere.getsockname()[1]
    local = [f"127.0.0.1:{mine}", f"127.0.0.1:{all_port}", f"0.0.0.0:{all_port}"]
    local.append(f"{host_address()}:{all_port}")
    router = gateway()
    if router:  # pasta maps no gateway to the host's loopback (--no-map-gw)
        local.append(f"{router}:{mine}")
    found = probe(box, *local, "pypi.org:443")
    assert found.pop("pypi.org:443") == "reached"  # DNS through DNS_ADDRESS, then TCP
    assert all(result.startswith("refused") for result in found.values()), found
    assert nothing_came(loopback, everywhere)
    # The control: the host's network reaches them (what setup had before).
    hosted = probe(Confinement(**{**box.__dict__, "network": "host"}), local[0], local[3])
    assert set(hosted.values()) == {"reached"}, hosted
    loopback.accept()[0].close()
    everywhere.accept()[0].close()


def test_the_sandbox_asks_dns_address_and_its_exit_status_is_passed_on(box: Confinement) -> None:
    result = run_confined(
        ["/bin/sh", "-c", "cat /etc/resolv.conf; exit 7"], box, Sandbox(), timeout=30
    )
    assert result.exit_code == 7
    assert f"nameserver {DNS_ADDRESS}" in result.output_tail


def test_the_routing_rules_cannot_be_removed_from_inside(
    box: Confinement, listeners: tuple[socket.socket, socket.socket]
) -> None:
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed")
    everywhere = listeners[1]
    target = f"{gateway() or host_address()}:{everywhere.getsockname()[1]}"
    script = "ip rule flush; ip rule del pref 100; ip rule | grep -c prohibit; python3 probe.py"
    result = run_confined(["/bin/sh", "-c", f"{script} {target}"], box, Sandbox(), 30)
    assert "Operation not permitted" in result.output_tail
    counted, found = result.output_tail.strip().splitlines()[-2:]
    assert int(counted) >= 3  # the host's address, its subnet, the gateway, link-local
    assert json.loads(found)[target].startswith("refused")


def test_a_proxy_on_the_hosts_loopback_is_reached_on_its_port_alone(
    box: Confinement,
    listeners: tuple[socket.socket, socket.socket],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.settimeout(5)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
    other = f"127.0.0.1:{listeners[0].getsockname()[1]}"
    found = probe(box, f"127.0.0.1:{proxy.getsockname()[1]}", other)
    assert found[f"127.0.0.1:{proxy.getsockname()[1]}"] == "reached"
    assert found[other].startswith("refused")
    proxy.accept()[0].close()
    proxy.close()
    assert nothing_came(listeners[0])


def test_pasta_carries_the_mark_alone_and_ends_with_the_command(
    box: Confinement, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = f"network-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(process.uuid, "uuid4", lambda: SimpleNamespace(hex=mark))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    seen: list[tuple[int, bytes]] = []

    def watch() -> None:
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            seen.extend(_marked(mark))
            time.sleep(0.05)

    import threading

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = run_confined(["/bin/sh", "-c", "sleep 2"], box, Sandbox(), 30)
    watcher.join()
    assert result.ok, result.output_tail
    assert seen, "no pasta carried the command's mark"
    for pid, environ in seen:
        assert environ == f"{command_guard.MARK_VARIABLE}={mark}".encode()  # nothing else
        assert not Path(f"/proc/{pid}").exists(), "pasta outlived its command"
    timed_out = run_confined(["/bin/sh", "-c", "sleep 30"], box, Sandbox(), timeout=1)
    assert timed_out.timed_out
    deadline = time.monotonic() + 5
    while _marked(mark):
        assert time.monotonic() < deadline, "pasta outlived its command's timeout"
        time.sleep(0.1)


def _marked(mark: str) -> list[tuple[int, bytes]]:
    """The pasta processes carrying ``mark``: pid and whole environment."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            program = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if entry.name.isdigit() and program.endswith(b"pasta"):
                environ = (entry / "environ").read_bytes().rstrip(b"\0")
                if mark.encode() in environ:
                    found.append((int(entry.name), environ))
        except OSError:
            continue
    return found


def test_pasta_dies_with_a_killed_worker(box: Confinement) -> None:
    marker = "sleep 297"
    parent = textwrap.dedent(
        f"""
        from pathlib import Path
        from merlin_flow.tool_config import Sandbox
        from merlin_flow.workspace.sandbox import Confinement, run_confined
        read_only = tuple(Path(p) for p in {[str(p) for p in box.read_only]!r})
        box = Confinement(Path({str(box.worktree)!r}), network=True, read_only=read_only)
        run_confined(["/bin/sh", "-c", "{marker}"], box, Sandbox(), 60)
        """
    )
    worker = subprocess.Popen([sys.executable, "-c", parent])
    try:
        deadline, pasta = time.monotonic() + 20, None
        while pasta is None:
            assert time.monotonic() < deadline, "the command never started"
            assert worker.poll() is None, "the worker ended before its command started"
            pasta = _pasta_of(marker)
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pasta}").exists() and b"Z" not in _state(pasta):
        assert time.monotonic() < deadline, "pasta outlived the killed worker"
        time.sleep(0.1)


def _pasta_of(marker: str) -> int | None:
    """The pasta attached by the launcher whose command line holds ``marker``."""
    launchers = subprocess.run(["pgrep", "-f", f"network_launcher.py.*{marker}"], text=True,
                               capture_output=True).stdout.split()  # fmt: skip
    for launcher in launchers:
        children = subprocess.run(["pgrep", "-P", launcher], capture_output=True, text=True)
        for child in children.stdout.split():
            if Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].endswith(b"pasta"):
                return int(child)
    return None


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"Z"


def test_when_pasta_fails_the_command_never_runs(
    box: Confinement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "pasta_path", lambda: "/bin/false")
    result = run_confined(["/bin/sh", "-c", "touch ran"], box, Sandbox(), 30)
    assert result.exit_code == NETWORK_FAILED_EXIT_CODE
    assert "outbound network could not be set up: pasta did not start" in result.output_tail
    time.sleep(0.5)  # a sandbox released by its bwrap's death would have run by now
    assert not (box.worktree / "ran").exists()


def test_a_bwrap_that_cannot_start_says_why(box: Confinement) -> None:
    argv = [*network.launcher({}), "bwrap", "--no-such-option", "--", "true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "no-such-option" in proc.stderr


def test_the_launcher_names_the_guards_mark() -> None:
    assert network_launcher.MARK_VARIABLE == command_guard.MARK_VARIABLE


def test_other_host_addresses_subnets_and_gateways_are_out_of_reach(tmp_path: Path) -> None:
    """In a network namespace of our own: a second link, like docker0 or a second NIC."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux's unshare and iproute2's ip")
    script = tmp_path / "inside.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, socket, sys
            from pathlib import Path
            from merlin_flow.tool_config import Sandbox
            from merlin_flow.workspace.sandbox import Confinement, python_mounts, run_confined
            listener = socket.create_server(("0.0.0.0", 0))
            port = listener.getsockname()[1]
            work = Path({str(tmp_path)!r}) / "worktree"
            work.mkdir()
            (work / "probe.py").write_text({PROBE!r})
            box = Confinement(work, network=True, read_only=python_mounts(None),
                              path=(str(Path(sys.executable).parent),))
            targets = [f"10.99.0.1:{{port}}", f"10.99.0.7:{{port}}", f"172.31.99.254:{{port}}",
                       f"172.31.99.1:{{port}}", "169.254.169.254:80"]
            found = {{}}
            for network in (True, "host"):
                box = Confinement(**{{**box.__dict__, "network": network}})
                result = run_confined(["python3", "probe.py", *targets], box, Sandbox(), 60)
                found[str(network)] = json.loads(result.output_tail.strip().splitlines()[-1])
            print(json.dumps(found))
            """
        )
    )
    links = (
        "ip link set lo up && ip link add up0 type bridge && ip addr add 172.31.99.1/24 dev up0"
        " && ip link set up0 up && ip link add second0 type bridge"
        " && ip addr add 10.99.0.1/24 dev second0 && ip link set second0 up"
        " && ip route add default via 172.31.99.254 dev up0"
    )
    proc = subprocess.run(
        ["unshare", "-rn", "/bin/sh", "-c", f'{links} && exec "$0" "$1"', sys.executable,
         str(script)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip(f"no network namespace of our own here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    outbound, hosted = found["True"], found["host"]
    assert all(result.startswith("refused") for result in outbound.values()), outbound
    assert "Permission denied" in outbound[next(iter(outbound))]  # prohibited, not refused
    assert hosted[next(iter(hosted))] == "reached"  # the control: the host's network does
