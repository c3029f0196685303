"""deploy/: the compose file, the Kubernetes manifests and the CI workflow validate against
their schemas, and they start the same worker roles as the Procfile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"


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


def test_compose_file_validates_against_the_compose_spec() -> None:
    result = _check_jsonschema("vendor.compose-spec", DEPLOY / "compose.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_catches_a_broken_compose_file(tmp_path: Path) -> None:
    broken = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
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
        env={"MERLIN_FLOWER_BASIC_AUTH": "a:b", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_migration_before_the_workers_and_has_healthchecks() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services: dict[str, Any] = compose["services"]
    assert {"redis", "postgres", "migrate", "llm", "verify", "flower"} <= set(services)
    assert services["migrate"]["command"] == ["merlin", "db", "upgrade"]
    for worker in ("llm", "verify"):
        needs = services[worker]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully"
        assert needs["redis"]["condition"] == "service_healthy"
        env = services[worker]["environment"]
        assert env["MERLIN_BROKER_URL"].startswith("redis://redis:")
        assert env["MERLIN_DATABASE_URL"].startswith("postgresql://")
    for name in ("redis", "postgres", "flower"):
        assert "healthcheck" in services[name]
    # The same worker roles as the Procfile.
    procfile = _procfile_commands()
    for role in ("llm", "verify"):
        assert " ".join(services[role]["command"]) == procfile[role]


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


@pytest.mark.parametrize(("name", "manifest"), _manifests(), ids=lambda v: str(v)[:40])
def test_kubernetes_manifest_validates(name: str, manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_kubernetes_validation_catches_a_broken_manifest() -> None:
    (_, deployment) = next(m for m in _manifests() if m[1]["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kubernetes_workers_are_one_deployment_per_role_with_config_and_secret() -> None:
    deployments = {
        doc["metadata"]["name"]: doc for _, doc in _manifests() if doc["kind"] == "Deployment"
    }
    assert {"merlin-worker-llm", "merlin-worker-verify", "merlin-flower"} <= set(deployments)
    procfile = _procfile_commands()
    for role in ("llm", "verify"):
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


def test_ci_workflow_validates_against_the_github_workflow_schema() -> None:
    result = _check_jsonschema("vendor.github-workflows", DEPLOY / "ci" / "merlin-refactor.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    workflow = yaml.safe_load((DEPLOY / "ci" / "merlin-refactor.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert {"schedule", "pull_request", "workflow_dispatch"} <= set(triggers)
    steps = workflow["jobs"]["refactor"]["steps"]
    run = next(s["run"] for s in steps if s.get("id") == "job")
    assert "--junit" in run
    assert "--patch" in run
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in steps)
