"""A PID and mount namespace per simulated machine (``--namespaces``): real machine boundaries.

Without it, every simulated machine shares this machine's PID namespace: a sweep sees
that a killed worker of *another* machine is gone (``leases.process_gone``) and takes
its steps over at once. Real machines cannot; their take-overs wait for the lease to
lapse. With it, each machine gets a namespace of its own:

- a *holder*, ``unshare --pid --fork --mount-proc --kill-child -- python -c REAPER``:
  its child is the namespace's init (pid 1 inside; it reaps what is orphaned in there),
  with a ``/proc`` of its own in a mount namespace of its own;
- each worker of the machine starts as ``nsenter --target <init> --pid --mount
  --wd=<cwd> -- merlin worker ...``, in a process group of its own whose leader is the
  ``nsenter`` (in this namespace, so ``os.killpg`` still kills the worker, its pool and
  its commands at once). The machine's workers see each other; no other machine's.

The campaign reads this namespace's ``/proc``, which sees every process under its own
pid; a lease token names a pid as the worker's namespace does (``NSpid``'s last field),
with the namespace's pid space (``space``). ``tokens_of_group`` translates.
Killing a namespace's init kills everything in it: ``close`` does that, at a machine's
crash (``--crash-every``) and at the end. A crashed machine boots again in a new
namespace; the kernel would give it the inode number, so the pid space, of the one it
lost (a rebooted machine has a new boot id, so a new space), unless something still
holds the old namespace: each ``Namespace`` holds its own until ``release``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROC = Path("/proc")

REAPER = """\
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""
"""The namespace's init: reaps every process orphaned inside it."""

SEEN = """\
import json, os, sys
marks = [m.encode() for m in sys.argv[1:]]
seen = dict.fromkeys(sys.argv[1:], 0)
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open(f"/proc/{name}/environ", "rb") as file:
            environ = file.read()
    except OSError:
        continue
    for mark, text in zip(marks, sys.argv[1:]):
        if mark in environ:
            seen[text] += 1
print(json.dumps({"self": os.readlink("/proc/self"), "seen": seen}))
"""
"""Run inside a namespace: how many processes it sees whose environment names each mark."""


def pid_space(pid: int | str = "self") -> str:
    """The pid space of process ``pid``, as ``leases._pid_space`` computes it inside it."""
    boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
    namespace = os.stat(PROC / str(pid) / "ns" / "pid").st_ino
    return hashlib.sha256(f"{boot}/{namespace}".encode()).hexdigest()[:8]


def namespace_of(pid: int) -> int | None:
    """The inode of process ``pid``'s PID namespace (None when it is gone)."""
    try:
        return os.stat(PROC / str(pid) / "ns" / "pid").st_ino
    except OSError:
        return None


def inner_pid(pid: int) -> int | None:
    """Process ``pid``'s pid in its own PID namespace (``NSpid``'s last field)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def tokens_of_group(pids: list[int]) -> set[tuple[str, int]]:
    """``(pid space, pid in its namespace)`` of each of ``pids``: what their tokens name."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            inner = inner_pid(pid)
            if inner is not None:
                found.add((pid_space(pid), inner))
    return found


def children(pid: int) -> list[int]:
    """The children of process ``pid`` (of its main thread)."""
    try:
        return [
            int(c) for c in (PROC / str(pid) / "task" / str(pid) / "children").read_text().split()
        ]
    except OSError:
        return []


def namespace_problem() -> str | None:
    """Why no PID namespace can be made here (None: one can): not root, no ``unshare``."""
    import shutil

    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} (util-linux)"
    result = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--", "true"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if result.returncode:
        return f"cannot make a PID namespace: {result.stderr.strip() or result.returncode}"
    return None


class Namespace:
    """One simulated machine's PID and mount namespace, held open by a holder process."""

    def __init__(self, name: str, log: Path) -> None:
        self.name = name
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as handle:
            self.holder = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
                 sys.executable, "-I", "-S", "-c", REAPER],
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd="/", env={"PATH": os.environ.get("PATH", "")},
            )  # fmt: skip
        self.init = self._find_init()
        self._pin: int | None = os.open(PROC / str(self.init) / "ns" / "pid", os.O_RDONLY)
        """Keeps the namespace, and so its inode number, after its processes are gone: a
        namespace made later (a machine booted again) gets a new pid space, never this one."""
        self.inode = os.fstat(self._pin).st_ino
        self.space = pid_space(self.init)

    def _find_init(self) -> int:
        """The holder's child, once it runs in its own PID namespace."""
        ours = namespace_of(os.getpid())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for child in children(self.holder.pid):
                if namespace_of(child) not in (None, ours) and inner_pid(child) == 1:
                    return child
            if self.holder.poll() is not None:
                break
            time.sleep(0.05)
        self.holder.kill()
        raise RuntimeError(f"{self.name}: no PID namespace (unshare exited {self.holder.poll()})")

    def enter(self, cwd: Path) -> list[str]:
        """The command prefix that runs a command in this namespace, in ``cwd``."""
        return ["nsenter", "--target", str(self.init), "--pid", "--mount", f"--wd={cwd}", "--"]

    def members(self) -> list[int]:
        """The processes in the namespace now but its init, under this namespace's pids."""
        found = []
        for name in os.listdir(PROC):
            if name.isdigit() and int(name) != self.init and namespace_of(int(name)) == self.inode:
                with contextlib.suppress(OSError):
                    state = (PROC / name / "stat").read_text().rpartition(")")[2].split()[0]
                    if state not in ("Z", "X"):
                        found.append(int(name))
        return found

    def seen(self, marks: list[str]) -> dict[str, int]:
        """How many processes this namespace's ``/proc`` shows whose environment holds each
        of ``marks`` (run inside it)."""
        result = subprocess.run(
            [*self.enter(Path("/")), sys.executable, "-I", "-S", "-c", SEEN, *marks],
            capture_output=True, text=True, timeout=30, check=True,
            env={"PATH": os.environ.get("PATH", "")},
        )  # fmt: skip
        answer = json.loads(result.stdout)
        seen: dict[str, int] = answer["seen"]
        return seen

    @property
    def closed(self) -> bool:
        """Whether the holder has ended (``close``)."""
        return self.holder.poll() is not None

    def close(self) -> None:
        """Kill the namespace's init (and so everything in it), then the holder."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)
        try:
            self.holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait(timeout=10)

    def release(self) -> None:
        """Let the kernel reuse the namespace's inode number (after ``close``)."""
        if self._pin is not None:
            os.close(self._pin)
            self._pin = None
