"""The bubblewrap sandbox: what a command sees, what it can reach, and how it ends.

These run real bwrap processes (CI installs the Debian package `bubblewrap`).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from merlin_flow.errors import SandboxUnavailable
from merlin_flow.tool_config import PermissionRules, Sandbox, SandboxMode
from merlin_flow.workspace import sandbox as sandbox_module
from merlin_flow.workspace.checkout import permission_masks
from merlin_flow.workspace.sandbox import (
    ENV_DIR,
    WORKSPACE,
    Confinement,
    bwrap_arguments,
    command_environment,
    python_mounts,
    run_confined,
    sandbox_problem,
    unenforceable,
)
from tests.conftest import require_bwrap

SECRET = "sk-sandbox-test-0123456789abcdef"
BWRAP = Sandbox()


@pytest.fixture(autouse=True)
def _needs_bwrap() -> None:
    require_bwrap()


@pytest.fixture
def box(tmp_path: Path) -> Confinement:
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / "file.txt").write_text("attempt's code\n")
    (worktree / ".git").write_text("gitdir: /nowhere/.git/worktrees/x\n")
    return Confinement(
        worktree=worktree,
        read_only=python_mounts(None),
        path=(str(Path(sys.executable).parent),),
    )


def sh(script: str, box: Confinement, config: Sandbox = BWRAP, timeout: float = 30) -> str:
    result = run_confined(["/bin/sh", "-c", script], box, config, timeout)
    return f"exit={result.exit_code}\n{result.output_tail}"


def test_the_worktree_is_read_write_at_workspace(box: Confinement) -> None:
    out = sh("pwd; cat file.txt; echo new > made.txt && echo wrote", box)
    assert out.splitlines() == ["exit=0", WORKSPACE, "attempt's code", "wrote"]
    assert (box.worktree / "made.txt").read_text() == "new\n"


def test_no_secret_reaches_the_command(box: Confinement, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MERLIN_DATABASE_URL", f"postgresql://u:{SECRET}@127.0.0.1/db")
    monkeypatch.setenv("LANG", "C.UTF-8")
    out = sh("env; cat /proc/1/environ /proc/self/environ 2>/dev/null | tr '\\0' '\\n'", box)
    assert SECRET not in out
    assert "OPENAI_API_KEY" not in out
    assert "MERLIN_DATABASE_URL" not in out
    assert "LANG=C.UTF-8" in out
    assert "HOME=/tmp/home" in out


def test_pass_env_passes_named_variables_only(
    box: Confinement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MERLIN_PROBE_PLAIN", "visible")
    monkeypatch.setenv("MERLIN_PROBE_OTHER", "hidden")
    out = sh(
        "echo ${MERLIN_PROBE_PLAIN:-unset} ${MERLIN_PROBE_OTHER:-unset}",
        box,
        Sandbox(pass_env=["MERLIN_PROBE_PLAIN"]),
    )
    assert out.splitlines()[1] == "visible unset"


def test_host_files_are_out_of_reach(box: Confinement, tmp_path: Path) -> None:
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text(SECRET)
    home = Path.home()
    out = sh(
        f"cat {host_file} || echo no-host-file;"
        f" ls {home} 2>/dev/null | head -3; echo home-listed;"
        f" echo x > {tmp_path}/escaped || echo no-host-write;"
        " echo x > /usr/escaped || echo no-system-write;"
        " cat /etc/shadow | wc -c",
        box,
    )
    assert SECRET not in out
    assert "no-host-file" in out
    assert "no-host-write" in out
    assert "no-system-write" in out
    assert out.strip().endswith("0")  # /etc/shadow is masked
    assert not (tmp_path / "escaped").exists()


def test_tmp_is_private(box: Confinement) -> None:
    marker = Path("/tmp") / f"merlin-sandbox-probe-{os.getpid()}"
    marker.write_text("host")
    try:
        out = sh(f"cat {marker} 2>/dev/null || echo not-seen; echo inside > {marker}", box)
        assert "not-seen" in out
        assert marker.read_text() == "host"
    finally:
        marker.unlink()


def test_git_pointer_is_read_only(box: Confinement) -> None:
    out = sh("echo 'gitdir: /elsewhere' > .git || echo refused; cat .git", box)
    assert "refused" in out
    assert (box.worktree / ".git").read_text() == "gitdir: /nowhere/.git/worktrees/x\n"


def test_no_network_by_default(box: Confinement) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    probe = textwrap.dedent(
        f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3)
            print("connected")
        except OSError as exc:
            print("refused", type(exc).__name__)
        """
    )
    try:
        (box.worktree / "probe.py").write_text(probe)
        assert "refused" in sh("python probe.py", box)
        # network = true is outbound only (test_network_launcher.py); "host" is the host's.
        with_net = Confinement(**{**box.__dict__, "network": "host"})
        assert "connected" in sh("python probe.py", with_net, Sandbox(network="host"))
    finally:
        listener.close()


def test_own_pid_namespace_cannot_signal_the_worker(box: Confinement) -> None:
    out = sh(f"kill -0 {os.getpid()} 2>&1 || echo cannot-signal; ls /proc | grep -c '^[0-9]'", box)
    assert "cannot-signal" in out
    assert int(out.splitlines()[-1]) < 5  # only the sandbox's own few processes


def test_environment_is_read_only_during_steps(box: Confinement, tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "hello").write_text("#!/bin/sh\necho hello from the env\n")
    (env / "bin" / "hello").chmod(0o755)
    step = Confinement(worktree=box.worktree, env_dir=env)
    out = sh(f"hello; echo $MERLIN_ENV; touch {ENV_DIR}/x 2>/dev/null || echo env-read-only", step)
    assert out.splitlines()[1:] == ["hello from the env", ENV_DIR, "env-read-only"]
    setup = Confinement(worktree=box.worktree, env_dir=env, env_writable=True)
    assert sh(f"touch {ENV_DIR}/x && echo built", setup).splitlines()[1] == "built"
    assert (env / "x").exists()


def test_timeout_kills_the_whole_sandbox(box: Confinement) -> None:
    started = time.monotonic()
    result = run_confined(
        ["/bin/sh", "-c", "sleep 301 & echo started; sleep 301"], box, BWRAP, timeout=1
    )
    assert result.timed_out
    assert time.monotonic() - started < 10
    leftover = subprocess.run(["pgrep", "-f", "sleep 301"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "a sandboxed process outlived the timeout"


def test_sandbox_dies_with_its_parent(box: Confinement, tmp_path: Path) -> None:
    """A killed worker leaves no sandboxed command behind (--die-with-parent)."""
    marker = "sleep 299"
    parent = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from merlin_flow.config import Sandbox
        from merlin_flow.workspace.sandbox import Confinement, run_confined
        box = Confinement(worktree=Path({str(box.worktree)!r}), read_only={box.read_only!r})
        run_confined(["/bin/sh", "-c", "{marker}"], box, Sandbox(), 60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 15
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "the sandboxed command never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the sandboxed command outlived its killed parent"
        time.sleep(0.1)


def test_huge_output_keeps_a_bounded_tail_without_memory(box: Confinement) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_confined(
        ["/bin/sh", "-c", "head -c 104857600 /dev/zero | tr '\\0' 'x'; echo; echo the-end"],
        box,
        Sandbox(max_file_size_mb=200),
        60,
        tail_chars=100,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.ok
    assert len(result.output_tail) == 100
    assert result.output_tail.endswith("the-end\n")
    assert grown_kib < 20 * 1024, f"reading 100 MB of output grew the worker by {grown_kib} KiB"


def test_file_size_limit(box: Confinement) -> None:
    out = sh(
        "head -c 3000000 /dev/zero > big.bin; echo status=$?", box, Sandbox(max_file_size_mb=1)
    )
    assert "status=0" not in out
    assert (box.worktree / "big.bin").stat().st_size <= 2**20


def test_mode_none_runs_unconfined_with_the_allowlisted_environment(
    box: Confinement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    out = sh("pwd; env", box, Sandbox(mode=SandboxMode.NONE))
    assert str(box.worktree) in out
    assert SECRET not in out


def test_missing_bwrap_is_a_clear_error(box: Confinement, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "sandbox_problem", lambda: "bubblewrap is not installed")
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
        run_confined(["true"], box, BWRAP, 5)


def test_sandbox_problem_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        problem = sandbox_problem()
        assert problem is not None
        assert "apt-get install bubblewrap" in problem
    finally:
        sandbox_problem.cache_clear()


def test_sandbox_problem_mounts_a_proc_as_a_steps_sandbox_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container whose /proc is masked lets bwrap start, but not mount a /proc: the
    probe must meet that, or doctor says ok while every step fails."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        '#!/bin/sh\ncase " $* " in *" --proc /proc "*) '
        'echo "bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted" >&2; '
        "exit 1;; esac\nexec true\n"
    )
    fake.chmod(0o755)
    sandbox_problem.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        problem = sandbox_problem()
    finally:
        sandbox_problem.cache_clear()
    assert problem is not None
    assert "Can't mount proc on /newroot/proc" in problem
    assert "a container's /proc masked" in problem


def test_credentials_in_proxy_urls_are_not_passed(
    box: Confinement, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("UV_INDEX_URL", f"https://user:{SECRET}@index.example/simple")
    networked = Confinement(worktree=box.worktree, network=True)
    env = command_environment(networked, Sandbox(network=True))
    assert env["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert "UV_INDEX_URL" not in env
    assert "HTTPS_PROXY" not in command_environment(box, BWRAP)


def test_bwrap_arguments_bind_nothing_of_home_or_merlin_home(box: Confinement) -> None:
    args = bwrap_arguments(box, {})
    bound = {args[i + 1] for i, a in enumerate(args) if a in ("--bind", "--ro-bind")}
    assert str(Path.home()) not in bound
    assert "--unshare-all" in args
    assert "--share-net" not in args
    assert "--die-with-parent" in args


# -- [permissions] masks: what a command cannot read or change ------------------------------


@pytest.fixture
def masked_tree(box: Confinement) -> Confinement:
    root = box.worktree
    for name, text in {
        "secrets/key": SECRET,
        "secrets/sub/deep": SECRET,
        ".env": f"API_KEY={SECRET}\n",
        "src/app.py": "print('app')\n",
        "uv.lock": "locked\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "door").symlink_to("secrets")  # a way round, inside the worktree
    (root / "alias").symlink_to("secrets/key")
    (root / "absolute").symlink_to(root / "secrets" / "key")
    rules = PermissionRules(deny=["Read(./secrets/**)", "Read(.env)", "Edit(*.lock)"])
    return box.masked(permission_masks(rules, root))


def test_hidden_paths_cannot_be_read_by_commands(masked_tree: Confinement) -> None:
    out = sh(
        "cat secrets/key || echo no-key; ls -A secrets; echo listed;"
        " cat secrets/sub/deep || echo no-deep; cat .env || echo no-env;"
        " grep -r sk- . 2>/dev/null; echo searched; cat src/app.py",
        masked_tree,
    )
    assert SECRET not in out
    for marker in ("no-key", "no-deep", "no-env", "searched"):
        assert marker in out
    assert out.split("listed")[0].splitlines()[-1].endswith("no-key")  # `ls secrets`: empty
    assert "print('app')" in out  # the rest of the worktree reads as before


def test_hidden_paths_stay_hidden_through_symlinks(masked_tree: Confinement) -> None:
    out = sh("cat door/key; cat alias; cat absolute; ls -A door; echo done", masked_tree)
    assert SECRET not in out
    assert out.splitlines()[-1] == "done"


def test_hidden_paths_cannot_be_changed_or_peeled_off(masked_tree: Confinement) -> None:
    root = masked_tree.worktree
    out = sh(
        "echo x > secrets/new; echo x > .env; rm -rf secrets; mv secrets s2;"
        " umount secrets; umount .env;"
        " unshare -Urm sh -c 'umount /workspace/secrets; mkdir -p /tmp/m;"
        " mount --bind /workspace /tmp/m; cat /tmp/m/secrets/key /workspace/secrets/key';"
        " cat secrets/key .env; echo done",
        masked_tree,
    )
    assert SECRET not in out
    assert out.splitlines()[-1] == "done"
    assert (root / "secrets" / "key").read_text() == SECRET
    assert (root / ".env").read_text() == f"API_KEY={SECRET}\n"
    assert not (root / "secrets" / "new").exists()
    assert not (root / "s2").exists()


def test_read_only_paths_cannot_be_written(masked_tree: Confinement) -> None:
    root = masked_tree.worktree
    out = sh("echo x >> uv.lock || echo refused; rm -f uv.lock; echo y > made.txt", masked_tree)
    assert "refused" in out
    assert (root / "uv.lock").read_text() == "locked\n"
    assert (root / "made.txt").read_text() == "y\n"  # the rest stays writable


def test_a_read_only_worktree_refuses_writes(box: Confinement) -> None:
    reader = replace(box, worktree_writable=False)
    out = sh("cat file.txt; touch x || echo refused; echo y > file.txt || echo refused", reader)
    assert out.splitlines()[:2] == ["exit=0", "attempt's code"]
    assert out.splitlines().count("refused") == 2
    assert not (box.worktree / "x").exists()
    assert (box.worktree / "file.txt").read_text() == "attempt's code\n"


def test_masks_that_leave_the_worktree_or_are_gone_are_skipped(box: Confinement) -> None:
    outside = box.worktree.parent / "outside"
    outside.mkdir()
    (box.worktree / "link").symlink_to(outside)
    confinement = replace(
        box,
        hidden=(box.worktree / "missing", box.worktree / "link", outside),
        read_only_paths=(box.worktree / "gone.lock",),
    )
    args = bwrap_arguments(confinement, {})
    inside = [a for a in args if a.startswith(f"{WORKSPACE}/") or a == str(outside)]
    assert inside == [f"{WORKSPACE}/.git"]
    assert sh("echo ok", confinement).splitlines() == ["exit=0", "ok"]


def test_mask_arguments_land_where_the_command_sees_them(masked_tree: Confinement) -> None:
    args = bwrap_arguments(masked_tree, {})
    worktree_bind = args.index(str(masked_tree.worktree))
    assert args[worktree_bind - 1] == "--bind"
    assert args.index(f"{WORKSPACE}/secrets") > worktree_bind
    assert args[args.index(f"{WORKSPACE}/secrets") - 1] == "--tmpfs"
    assert args[args.index(f"{WORKSPACE}/.env") - 2 : args.index(f"{WORKSPACE}/.env")] == [
        "--ro-bind",
        "/dev/null",
    ]
    assert "--cap-drop" in args
    reader = replace(masked_tree, worktree_writable=False)
    assert bwrap_arguments(reader, {})[worktree_bind - 1] == "--ro-bind"


def test_mode_none_cannot_mask_and_says_so(masked_tree: Confinement) -> None:
    none = Sandbox(mode=SandboxMode.NONE)
    warning = unenforceable(masked_tree, none)
    assert warning is not None
    assert warning.startswith('warning: [sandbox] mode = "none" cannot hide .env, secrets')
    assert "keep uv.lock unchanged" in warning
    reader = replace(masked_tree, hidden=(), read_only_paths=(), worktree_writable=False)
    assert "keep the worktree read-only" in (unenforceable(reader, none) or "")
    assert unenforceable(masked_tree, BWRAP) is None
    assert unenforceable(Confinement(worktree=masked_tree.worktree), none) is None
    assert SECRET in sh("cat secrets/key", masked_tree, none)  # runs, unmasked: not an error


def test_an_environments_pyvenv_cfg_mounts_nothing(box: Confinement, tmp_path: Path) -> None:
    """Setup writes ``pyvenv.cfg``: its ``home`` never picks a host folder to mount.

    The old ``python_mounts`` bound the parent of whatever ``home`` named, read-only: a
    build could expose the user's checkout and its ``.git``.
    """
    from merlin_flow.workspace.default_setup import interpreter

    victim = tmp_path / "user-checkout"
    (victim / ".git").mkdir(parents=True)
    (victim / ".git" / "config").write_text("[remote] url = secret\n")
    env = tmp_path / "env"
    env.mkdir()
    (env / "pyvenv.cfg").write_text(f"home = {victim}/x\nversion = 3\n")
    mounts = python_mounts(env)
    assert victim not in mounts
    base = interpreter().parent.parent  # what setup built on: the base of merlin's Python
    assert base.is_relative_to("/usr") or base in mounts
    stepped = replace(box, env_dir=env, read_only=mounts)
    assert "secret" not in sh(f"cat {victim}/.git/config", stepped)
