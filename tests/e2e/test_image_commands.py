"""The image's own commands, run the way its containers run them: as an unprivileged
user, with the image's environment and the mounted config, against Redis and Postgres.

What the containers run is read from the shipped files at test time: the environment
from deploy/Dockerfile's ``ENV`` lines and the compose services' ``environment``, the
commands of the ``migrate``, ``llm`` and ``verify`` services from deploy/compose.yaml,
and the system config from the ``merlin.toml`` of deploy/k8s/configmap.yaml (mounted
at /etc/merlin/merlin.toml in the pods). What the test cannot reproduce it redirects,
and it checks that nothing else differs:

- the user: uid and gid 65534 (nobody) stand for the image's ``USER``;
- ``MERLIN_HOME``: a folder of the test's, owned by that user, for the image's (the test
  cannot create that path on this machine);
- ``MERLIN_BROKER_URL`` and ``MERLIN_DATABASE_URL``: the test's own Redis and its own
  Postgres database, for the compose services ``redis`` and ``postgres``;
- the config mount: ``MERLIN_SYSTEM_CONFIG`` names a file holding the configmap's
  ``merlin.toml``, root's and read-only to the user, as the mount is;
- the image: the wheel built from this checkout, installed into a fresh virtual
  environment (tests/installed.py) as the Dockerfile's ``pip install`` installs it, on a
  Python of the Dockerfile's version that the unprivileged user can read; its ``bin``
  comes first on ``PATH``, as /usr/local/bin does in the image;
- the container runtime's variables: ``PATH``, ``LANG`` (the python image's), and
  ``HOME``, the user's own from the password database: nobody's does not exist, so
  merlin must keep what it writes in ``MERLIN_HOME``;
- the host's network: its CA bundle (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, when set
  here), which a container on this host needs too to reach PyPI through its TLS proxy
  (the job's environment setup installs pytest with uv).

The configmap's tiers name real providers, unreachable here, so the job is submitted,
by the same user, with a trusted ``--config`` of scripted tiers.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import git, make_repo, require_bwrap
from tests.e2e.helpers import wait_for, write_job_files
from tests.installed import ROOT, build, install

pytestmark = pytest.mark.e2e
DEPLOY = ROOT / "deploy"
USER = 65534
"""The unprivileged uid and gid the commands run as (nobody, nogroup)."""
SERVICES = ("migrate", "llm", "verify")
REDIRECTED = {"MERLIN_HOME", "MERLIN_BROKER_URL", "MERLIN_DATABASE_URL"}
"""The image's variables the test gives other values (the module docstring says why)."""
MOUNTED = {"MERLIN_SYSTEM_CONFIG"}
"""Added: the stand-in for the config mount at /etc/merlin/merlin.toml."""
RUNTIME = {"PATH", "LANG", "HOME"}
"""Given by the base image and the container runtime, not by deploy/: the test's own."""
HOST_TRUST = ("SSL_CERT_FILE", "SSL_CERT_DIR")
"""The host's CA bundle, passed on when set (the module docstring says why)."""
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROVIDER_KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
COMPOSE_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::?(?P<op>[-?])(?P<word>[^}]*))?\}")


def _dockerfile_instructions(name: str) -> list[str]:
    """The arguments of every ``name`` instruction of deploy/Dockerfile, lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    return [
        words[1]
        for line in text.splitlines()
        if len(words := line.split(None, 1)) == 2 and words[0].upper() == name
    ]


def dockerfile_env() -> dict[str, str]:
    """The variables the Dockerfile's ``ENV`` lines set (``K=V ...`` or ``K V``)."""
    env: dict[str, str] = {}
    for arguments in _dockerfile_instructions("ENV"):
        words = shlex.split(arguments)
        if "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, value = word.split("=", 1)
            env[key] = value
    return env


def _compose_value(value: Any) -> str:
    """A compose value with its ``${NAME:-default}`` filled in for a shell without NAME."""

    def fill(match: re.Match[str]) -> str:
        if match["op"] == "?":  # required of the shell: the test's own stands in
            return f"test-{match['name'].lower()}"
        return match["word"] or ""

    return COMPOSE_VARIABLE.sub(fill, str(value))


def compose_services() -> dict[str, dict[str, Any]]:
    """deploy/compose.yaml's services, their ``<<`` merges applied."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def image_env(service: dict[str, Any]) -> dict[str, str]:
    """What a compose container of ``service`` gets: the image's ENV, then its own."""
    declared = service.get("environment") or {}
    assert isinstance(declared, dict), "environment as a mapping"
    passed_on = {k: _compose_value(v) for k, v in declared.items() if v is not None}
    return {**dockerfile_env(), **passed_on}  # a bare NAME: passed on from the shell, unset


def configmap() -> dict[str, str]:
    """The data of deploy/k8s/configmap.yaml."""
    manifest = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    data: dict[str, str] = manifest["data"]
    return data


def _as_user() -> dict[str, Any]:
    return {"user": USER, "group": USER, "extra_groups": [], "umask": 0o022}


def _python_version() -> str:
    """The Python of the Dockerfile's base, ``python:X.Y...`` (this one's otherwise)."""
    bases = [arg.split("=", 1)[1] for arg in _dockerfile_instructions("ARG") if "=" in arg]
    for image in [*_dockerfile_instructions("FROM"), *bases]:
        match = re.match(r"python:(\d+\.\d+)", image)
        if match:
            return match[1]
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _interpreter_for_user(version: str) -> str:
    """A Python ``version`` that the unprivileged user runs as root does.

    This process's own may lie under a home the user cannot enter (pyenv in /root):
    started from there, it would fail, or run on another Python's standard library.
    """
    probe = "import sys; print(sys.version, sys.base_prefix)"
    candidates = [
        str(Path(sys.base_prefix) / "bin" / f"python{version}"),
        *(shutil.which(f"python{version}", path=d) for d in SAFE_PATH.split(os.pathsep)),
    ]
    seen = []
    for candidate in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        as_root = subprocess.run([candidate, "-c", probe], capture_output=True, text=True)
        try:
            as_user = subprocess.run(
                [candidate, "-c", probe], capture_output=True, text=True, env={}, **_as_user()
            ).stdout
        except OSError as exc:
            as_user = str(exc)
        if as_user == as_root.stdout:
            return candidate
        seen.append(f"{candidate}: as root {as_root.stdout!r}, as {USER} {as_user!r}")
    problem = f"no Python {version} that uid {USER} can run intact:\n" + "\n".join(seen)
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


def _give_to_user(path: Path) -> None:
    for folder, dirs, files in os.walk(path):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chown(name, USER, USER, follow_symlinks=False)


def _users_in_tmp() -> set[Path]:
    """What the user owns at the top of /tmp (the image sets no TMPDIR)."""
    return {path for path in Path("/tmp").iterdir() if path.lstat().st_uid == USER}


@contextlib.contextmanager
def _public_folder() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="merlin-image-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(env: dict[str, str], cwd: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as the unprivileged user, found on ``env``'s PATH as a container would."""
    return subprocess.run(
        list(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=180,
        check=False, **_as_user(),
    )  # fmt: skip


def _start(
    env: dict[str, str], cwd: Path, log: Path, command: list[str]
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, **_as_user(),
        )  # fmt: skip


def _stop(worker: subprocess.Popen[bytes]) -> int | None:
    """Warm shutdown (SIGTERM) as the runtime asks for it; its exit code, None if killed."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_image_and_the_manifests_agree() -> None:
    """The image runs unprivileged, with the MERLIN_HOME the Kubernetes config gives it."""
    users = _dockerfile_instructions("USER")
    assert users, "deploy/Dockerfile names no USER: its commands would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    assert dockerfile_env()["MERLIN_HOME"] == configmap()["MERLIN_HOME"]


def _environments(
    services: dict[str, dict[str, Any]],
    venv: Path,
    home: Path,
    system_config: Path,
    redis_url: str,
    postgres_url: str,
) -> dict[str, dict[str, str]]:
    """Each service's container environment, redirected as the module docstring says."""
    envs = {}
    for name in SERVICES:
        shipped = image_env(services[name])
        assert shipped["MERLIN_BROKER_URL"].startswith("redis://")  # as the test's
        assert shipped["MERLIN_DATABASE_URL"].startswith("postgresql://")
        env = {
            "LANG": "C.UTF-8",
            "HOME": pwd.getpwuid(USER).pw_dir,
            **shipped,
            "PATH": f"{venv / 'bin'}{os.pathsep}{SAFE_PATH}",
            "MERLIN_HOME": str(home),
            "MERLIN_BROKER_URL": redis_url,
            "MERLIN_DATABASE_URL": postgres_url,
            "MERLIN_SYSTEM_CONFIG": str(system_config),
            **{k: os.environ[k] for k in HOST_TRUST if k in os.environ},
        }
        assert {k for k in shipped if env[k] != shipped[k]} - RUNTIME == REDIRECTED
        assert set(env) - set(shipped) - RUNTIME - set(HOST_TRUST) == MOUNTED
        envs[name] = env
    return envs


def test_the_image_commands_run_a_job_as_an_unprivileged_user(
    tmp_path: Path, redis_url: str, postgres_url: str
) -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("runs the image's commands as another user: needs root in CI")
        pytest.skip("runs the image's commands as another user: needs root")
    require_bwrap()
    services = compose_services()
    commands = {name: [str(word) for word in services[name]["command"]] for name in SERVICES}
    python = _interpreter_for_user(_python_version())
    _sdist, wheel = build(tmp_path / "dist")
    tmp_before = _users_in_tmp()

    with _public_folder() as public:
        venv = public / "venv"
        install(wheel, venv, python)
        work = public / "work"  # the containers' WORKDIR: theirs, nothing in it needed
        home = public / "merlin-home"
        system_config = public / "etc-merlin" / "merlin.toml"
        for folder in (work, home, system_config.parent):
            folder.mkdir()
        system_config.write_text(configmap()["merlin.toml"])
        repo = make_repo(
            public / "repos" / "sample",
            {
                "pyproject.toml": '[project]\nname = "sample"\nversion = "0"\n',
                "app.py": "def answer():\n    return 41\n",
                "test_app.py": (
                    "from app import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
                ),
            },
        )
        for folder in (work, home, repo.parent):  # the repositories' volume is theirs too
            _give_to_user(folder)
        tasklist, scripted = write_job_files(public / "job")
        envs = _environments(services, venv, home, system_config, redis_url, postgres_url)
        env = envs["llm"]  # `docker compose exec llm merlin submit ...`, as compose.yaml says

        migrated = _run(envs["migrate"], work, *commands["migrate"])
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        logs = {name: public / f"{name}.log" for name in ("llm", "verify")}
        workers = {name: _start(envs[name], work, logs[name], commands[name]) for name in logs}
        try:
            submitted = _run(
                env, work, "merlin", "submit", str(tasklist), "--repo", str(repo),
                "--config", str(scripted), "--json",
            )  # fmt: skip
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            job_id = json.loads(submitted.stdout)["job_id"]

            def finished() -> dict[str, Any] | None:
                shown = _run(env, work, "merlin", "status", job_id, "--json")
                assert shown.returncode == 0, shown.stdout + shown.stderr
                view: dict[str, Any] = json.loads(shown.stdout)
                return view if view["finished_at"] else None

            view = wait_for(finished, 240, "the job to finish", poll=2)
            doctor = _run(env, work, "merlin", "doctor", "--json")  # while both roles run
        finally:
            exits = {name: _stop(worker) for name, worker in workers.items()}
        text = {name: log.read_text() for name, log in logs.items()}

        assert view["status"] == "completed", f"{view['error']}\n{text['llm'][-3000:]}"
        assert [(s["id"], s["status"], s["tier"]) for s in view["steps"]] == [
            ("fix", "Completed", "local"), ("slow", "Completed", "local"),
            ("docs", "Completed", "local"),
        ]  # fmt: skip
        shown = git(repo, "-c", "safe.directory=*", "show", f"merlin/{job_id}:app.py")
        assert shown.endswith("return 42")
        # Each role took its own queues: agents and finalize on llm, exit commands on verify.
        assert "Task merlin.step[" in text["llm"]
        assert "Task merlin.finalize[" in text["llm"]
        assert "Task merlin.verify[" in text["verify"]
        assert "Task merlin.verify[" not in text["llm"]
        assert "Task merlin.step[" not in text["verify"]
        for name, log in text.items():
            for sign in ("Permission denied", "PermissionError", "Read-only file system"):
                assert sign not in log, f"{name} worker:\n{log[-3000:]}"
        # A warm shutdown: each worker exits 0 and leaves no process behind ...
        assert exits == {"llm": 0, "verify": 0}, {n: t[-2000:] for n, t in text.items()}
        assert not [name for name, worker in workers.items() if _group_alive(worker.pid)]
        # ... nor a file outside its folders.
        assert _users_in_tmp() - tmp_before == set()

        # `merlin doctor`, as the containers run it: the mounted config is read, and the
        # database, the broker, the sandbox and both roles' queues answer the user.
        print("merlin doctor --json:", doctor.stdout, doctor.stderr, sep="\n")
        checks = {check["name"]: check for check in json.loads(doctor.stdout)}
        read, _, skipped = checks["config"]["detail"].partition("\nnot read: ")
        defaults = venv / "lib" / f"python{_python_version()}" / "site-packages"
        assert read.startswith(f"1. defaults {defaults}/merlin_flow/_bundled/"), read
        assert f"\n2. system {system_config}" in read, checks["config"]
        assert skipped == f"user {home / 'merlin.toml'} (absent)", checks["config"]
        for name in ("sandbox", "database", "broker", "queue control", "queue llm",
                     "queue verify"):  # fmt: skip
            assert checks[name]["verdict"] == "ok", checks[name]
        # The configmap's tiers are the ones in effect. Their provider keys are unset or
        # unset (compose.yaml passes them on only when the shell has them): a tier
        # that needs one cannot be used, and doctor must not call it ok.
        tiers = tomllib.loads(configmap()["merlin.toml"])["tiers"]
        for tier in tiers:
            assert tier["model"] in checks[f"tier {tier['name']}"]["detail"]
        keyless = [
            checks[f"tier {tier['name']}"]
            for tier in tiers
            if (key := PROVIDER_KEYS.get(tier["model"].split("/")[0])) and not env.get(key)
        ]
        assert keyless
        assert [check for check in keyless if check["verdict"] == "ok"] == []
