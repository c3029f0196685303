"""The launcher in front of bwrap that gives its sandbox the outbound network, through pasta.

``merlin_flow.workspace.network.launcher`` puts it before bwrap's command line for a
command with the outbound network. It imports a few standard modules only (no ``json``,
no ``socket``: ``_socket``) and runs with ``python -I -S``::

    python -I -S network_launcher.py RESOLV OPEN -- pasta OPTIONS... --
        [prlimit ...] bwrap ... --info-fd 3 --block-fd 4 --ro-bind-data 5 /etc/resolv.conf
        ... -- argv...

1. It starts bwrap, which unshares every namespace, writes its sandbox's pid to fd 3 and
   waits on fd 4 before the command runs; fd 5 holds the sandbox's ``resolv.conf``
   (``RESOLV``: ``DNS_ADDRESS`` to ask).
2. It opens the sandbox's first process (a pidfd), its network namespace, checked to be
   the one bwrap named, and the user namespace that owns that (``NS_GET_USERNS``: bwrap
   nests a second one, from which the network's cannot be joined).
3. It reads the host's routes (netlink): its own addresses, the subnets on its links and
   its gateways, loopback left out, and adds the link-local ranges (``ALWAYS_BLOCKED``).
4. It starts pasta in the foreground on both namespaces, dying with the launcher
   (``PR_SET_PDEATHSIG``), with nothing but the command's mark in its environment and
   its output kept apart. pasta writes its pid once the namespace is configured.
5. A child joins both namespaces and adds routing rules that the command, with no
   capability, cannot remove: each prefix of step 3 is prohibited, and the addresses in
   ``OPEN`` (``family,address,port,protocol``, space-separated: the DNS address, the
   proxies and indexes the command's variables name) are let through on their port.
6. It unblocks bwrap, waits for it, kills pasta and passes the exit status on.

When a step fails, the sandbox is killed before its command runs (its first process
before bwrap: without bwrap, a blocked sandbox goes on) and the output says why, exit code
``NETWORK_FAILED_EXIT_CODE``. When bwrap ends before its sandbox starts, its own message
and exit code are passed on.
"""

from __future__ import annotations

import _socket
import ctypes
import fcntl
import os
import select
import signal
import struct
import sys

DNS_ADDRESS = "198.18.53.53"
"""Where the sandbox sends DNS queries; pasta forwards them to the host's resolver, on its
loopback (systemd-resolved's, Docker's) or not. An address set aside for benchmarks."""
INFO_FD, BLOCK_FD, RESOLV_FD = 3, 4, 5
"""Where bwrap finds the launcher's pipes (``--info-fd``, ``--block-fd``, ``--ro-bind-data``)."""
ATTACH_SECONDS = 30.0
"""How long pasta may take to configure the namespace (it takes 30 to 100 ms)."""
NETWORK_FAILED_EXIT_CODE = 125
MARK_VARIABLE = "MERLIN_COMMAND_MARK"
"""``command_guard.MARK_VARIABLE``: pasta carries it, so the guard kills it with the command."""
ALWAYS_BLOCKED = ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128")
"""Link-local ranges, where cloud metadata services answer, whatever the host's routes say."""
PR_SET_PDEATHSIG = 1
NS_GET_USERNS = 0xB701
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
AF_INET, AF_INET6, AF_NETLINK, SOCK_RAW, EAFNOSUPPORT = 2, 10, 16, 3, 97
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_CREATE = 0x1, 0x4, 0x300, 0x400
NLMSG_ERROR, NLMSG_DONE, RTM_NEWROUTE, RTM_GETROUTE, RTM_NEWRULE = 2, 3, 24, 26, 32
RTA_DST, RTA_GATEWAY, RTA_TABLE = 1, 5, 15
FRA_DST, FRA_PRIORITY, FRA_TABLE, FRA_IP_PROTO, FRA_DPORT_RANGE = 1, 6, 15, 22, 24
RT_TABLE_MAIN, RT_TABLE_LOCAL, RTN_UNICAST, RTN_LOCAL = 254, 255, 1, 2
FR_ACT_TO_TBL, FR_ACT_PROHIBIT = 1, 8
OPEN_PRIORITY, BLOCK_PRIORITY = 90, 100
"""Rule priorities: what is let through first, then what is prohibited (0 is the local table)."""

Prefix = tuple[int, bytes, int]
"""An address family, a packed address and a prefix length."""


class AttachFailed(Exception):
    """The sandbox's network could not be set up: its command must not run."""


def main(argv: list[str]) -> int:
    """Run the command after the second ``--`` with pasta, after the first, attached."""
    _die_with_parent()
    resolv, opened = argv[0], [item.split(",") for item in argv[1].split()]
    second = argv.index("--", 3)
    pasta_argv, command = argv[3:second], argv[second + 1 :]
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    resolv_r, resolv_w = os.pipe()
    os.write(resolv_w, resolv.encode())
    os.close(resolv_w)
    sandbox = _spawn(command, {INFO_FD: info_w, BLOCK_FD: block_r, RESOLV_FD: resolv_r})
    for fd in (info_w, block_r, resolv_r):
        os.close(fd)
    pasta = inside = None
    try:
        info = _read_all(info_r).decode()
        if info:  # else bwrap ended before its sandbox started: its own message says why
            inside, netns, userns = _namespaces(info)
            blocked = _host_prefixes()
            pasta = _start_pasta(pasta_argv, userns, netns)
            _add_rules(userns, netns, blocked, opened)
            os.write(block_w, b"x")
    except (OSError, ValueError, AttachFailed) as exc:
        if inside is not None:  # first: once bwrap itself is gone, its sandbox goes on
            try:
                signal.pidfd_send_signal(inside, signal.SIGKILL)
            except ProcessLookupError:
                inside = None  # gone already
        _kill(sandbox)
        _kill(pasta)
        print(
            f"[merlin] the sandbox's outbound network could not be set up: {exc}", file=sys.stderr
        )
        return NETWORK_FAILED_EXIT_CODE
    status = os.waitpid(sandbox, 0)[1]
    _kill(pasta)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: end the same way, so the guard sees it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # theirs cannot be changed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _die_with_parent() -> None:
    """SIGKILL when the parent thread exits (the guard's, or the MCP client's)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn(
    argv: list[str], fds: dict[int, int], env: dict[str, str] | None = None, output: int = -1
) -> int:
    """Start ``argv`` with ``fds`` at the numbers given, in this process's environment.

    With ``env``: in that environment instead, dying with this process, with stdin from
    /dev/null and stdout and stderr into ``output``.
    """
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns
        for number in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python, not by others
            signal.signal(number, signal.SIG_DFL)
        if env is not None:
            _die_with_parent()
            for target, fd in ((0, os.open(os.devnull, os.O_RDONLY)), (1, output), (2, output)):
                os.dup2(fd, target)
        high = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for target, fd in fds.items()}
        for target, fd in high.items():
            os.dup2(fd, target)  # inheritable
        if env is None:
            os.execvp(argv[0], argv)
        os.execve(argv[0], argv, env)
    except OSError as exc:
        print(f"cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(127)


def _kill(pid: int | None) -> None:
    """SIGKILL a child of ours, and reap it."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data


def _number(info: str, key: str) -> int:
    """The number after ``"key":`` in bwrap's JSON (ValueError without one)."""
    _, found, rest = info.partition(f'"{key}":')
    digits = rest.lstrip().partition(",")[0].partition("}")[0].strip()
    if not found or not digits.isdigit():
        raise ValueError(f"bwrap did not say its {key}")
    return int(digits)


def _namespaces(info: str) -> tuple[int, int, int]:
    """The sandbox's first process (a pidfd), its network namespace and that one's owner."""
    pid = _number(info, "child-pid")
    inside = os.pidfd_open(pid)
    netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if os.fstat(netns).st_ino != _number(info, "net-namespace"):
        raise AttachFailed("the sandbox ended before its network was set up")
    return inside, netns, fcntl.ioctl(netns, NS_GET_USERNS)


def _start_pasta(options: list[str], userns: int, netns: int) -> int:
    """Start pasta on the namespaces; its pid, once it says it has configured them."""
    pid_r, pid_w = os.pipe()
    try:
        output = os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:
        output = os.open(os.devnull, os.O_WRONLY)
    argv = [*options, "--userns", "/proc/self/fd/3", "--netns", "/proc/self/fd/4"]
    mark = {k: v for k, v in os.environ.items() if k == MARK_VARIABLE}
    fds = {3: userns, 4: netns, 5: pid_w}
    pasta = _spawn([*argv, "--pid", "/proc/self/fd/5"], fds, env=mark, output=output)
    os.close(pid_w)
    said = b""
    while b"\n" not in said and select.select([pid_r], [], [], ATTACH_SECONDS)[0]:
        chunk = os.read(pid_r, 64)
        if not chunk:
            break
        said += chunk
    os.close(pid_r)
    if said.strip().isdigit():
        os.close(output)
        return pasta
    _kill(pasta)
    os.lseek(output, 0, os.SEEK_SET)
    text = os.read(output, 8192).decode(errors="replace").splitlines()
    os.close(output)
    lines = [line for line in text if line.strip() and "syslog" not in line]
    raise AttachFailed(f"pasta did not start: {lines[-1] if lines else 'it said nothing'}")


def _add_rules(userns: int, netns: int, blocked: list[Prefix], opened: list[list[str]]) -> None:
    """In the sandbox's namespaces: let ``opened`` through, prohibit the ``blocked`` prefixes."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            for fd, kind in ((userns, CLONE_NEWUSER), (netns, CLONE_NEWNET)):
                if libc.setns(fd, kind) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            link = _socket.socket(AF_NETLINK, SOCK_RAW, 0)  # in the sandbox's namespace
            for family, address, port, protocol in opened:
                packed = _socket.inet_pton(int(family), address)
                prefix = (int(family), packed, len(packed) * 8)
                match = (int(protocol), int(port))
                _rule(link, prefix, OPEN_PRIORITY, FR_ACT_TO_TBL, RT_TABLE_MAIN, match)
            for prefix in blocked:
                try:
                    _rule(link, prefix, BLOCK_PRIORITY, FR_ACT_PROHIBIT)
                except OSError as exc:  # a kernel without IPv6 reaches nothing over it
                    if prefix[0] != AF_INET6 or exc.errno != EAFNOSUPPORT:
                        raise
            code = 0
        except (OSError, ValueError) as exc:
            print(f"cannot add the sandbox's routing rules: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) != 0:
        raise AttachFailed("its routing rules could not be added")


def _rule(
    link: _socket.socket,
    prefix: Prefix,
    priority: int,
    action: int,
    table: int = 0,
    match: tuple[int, int] | None = None,
) -> None:
    """Add one rule: ``ip rule add to PREFIX [ipproto P dport N] prio N ACTION``."""
    family, packed, length = prefix
    body = struct.pack("=8BI", family, length, 0, 0, table, 0, 0, action, 0)
    body += _attr(FRA_DST, packed) + _attr(FRA_PRIORITY, struct.pack("=I", priority))
    if table:
        body += _attr(FRA_TABLE, struct.pack("=I", table))
    if match is not None:
        protocol, port = match
        body += _attr(FRA_IP_PROTO, bytes([protocol]))
        body += _attr(FRA_DPORT_RANGE, struct.pack("=HH", port, port))
    link.send(_message(RTM_NEWRULE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE, body))
    answer = link.recv(65536)
    kind, error = struct.unpack_from("=H", answer, 4)[0], struct.unpack_from("=i", answer, 16)[0]
    if kind != NLMSG_ERROR or error:
        shown = f"{_socket.inet_ntop(family, packed)}/{length}"
        raise OSError(-error, f"the rule to {shown}: {os.strerror(-error)}")


def _message(kind: int, flags: int, body: bytes) -> bytes:
    """One netlink message: its header, then ``body``."""
    return struct.pack("=IHHII", 16 + len(body), kind, flags, 1, 0) + body


def _attr(kind: int, data: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)


def _host_prefixes() -> list[Prefix]:
    """What the sandbox must not reach: the host's addresses, on-link subnets and gateways.

    Read from the host's routes (the local table's own addresses; the main table's routes
    without a gateway, and its gateways) with ``ALWAYS_BLOCKED``; loopback left out (the
    sandbox has its own); each prefix once, its host bits cleared.
    """
    found: set[Prefix] = set()
    for text in ALWAYS_BLOCKED:
        address, _, bits = text.partition("/")
        family = AF_INET6 if ":" in address else AF_INET
        found.add((family, _socket.inet_pton(family, address), int(bits)))
    for family, table, kind, length, attrs in _routes():
        destination, gateway = attrs.get(RTA_DST), attrs.get(RTA_GATEWAY)
        if table == RT_TABLE_LOCAL and kind == RTN_LOCAL and destination:
            found.add((family, destination, length))
        elif table == RT_TABLE_MAIN and kind == RTN_UNICAST and gateway:
            found.add((family, gateway, len(gateway) * 8))
        elif table == RT_TABLE_MAIN and kind == RTN_UNICAST and destination and length:
            found.add((family, destination, length))  # a subnet on one of the host's links
    prefixes = set()
    for family, packed, length in found:
        host_bits = len(packed) * 8 - length
        number = int.from_bytes(packed, "big") >> host_bits << host_bits
        packed = number.to_bytes(len(packed), "big")
        if not (packed[0] == 127 if family == AF_INET else number == 1):  # loopback
            prefixes.add((family, packed, length))
    return sorted(prefixes)


def _routes() -> list[tuple[int, int, int, int, dict[int, bytes]]]:
    """The host's routes, every family's and table's: (family, table, type, length, attributes)."""
    routes: list[tuple[int, int, int, int, dict[int, bytes]]] = []
    link = _socket.socket(AF_NETLINK, SOCK_RAW, 0)
    try:
        link.send(_message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, bytes(12)))
        while True:
            data, offset = link.recv(1 << 20), 0
            while offset + 16 <= len(data):
                size, kind = struct.unpack_from("=IH", data, offset)
                if kind == NLMSG_DONE:
                    return routes
                if kind == NLMSG_ERROR:
                    raise OSError(-struct.unpack_from("=i", data, offset + 16)[0], "route dump")
                if kind == RTM_NEWROUTE:
                    header = struct.unpack_from("=8B", data, offset + 16)
                    family, length, table, rtype = header[0], header[1], header[4], header[7]
                    attrs, at = {}, offset + 28
                    while at + 4 <= offset + size:
                        attr_size, key = struct.unpack_from("=HH", data, at)
                        attrs[key] = data[at + 4 : at + attr_size]
                        at += max(4, (attr_size + 3) & ~3)
                    if RTA_TABLE in attrs:
                        table = struct.unpack("=I", attrs[RTA_TABLE])[0]
                    routes.append((family, table, rtype, length, attrs))
                offset += max(16, (size + 3) & ~3)
    finally:
        link.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
