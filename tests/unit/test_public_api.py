"""The curated public API, and a CLI that starts without its heavy dependencies."""

from __future__ import annotations

import subprocess
import sys

import merlin_flow

PINNED_API = {
    "Action", "AgentError", "AttemptKind", "BudgetExceeded", "Decision", "Failure",
    "FailureKind", "classify", "Complexity", "Routing", "start_tier", "ConfigError",
    "GitError", "InputError", "JobNotFoundError",
    "LeaseLost", "Limits", "MerlinConfig", "MerlinError", "JobStatus",
    "RepositoryError", "Script", "Settings", "StepFailure", "StepStatus", "StepType",
    "StoreError", "TaskList", "TaskListError", "AttemptStatus", "Phase", "TaskStep", "Tier",
    "Toolbox",
    "create_job", "submit_job", "Submission", "decide", "enqueue_job", "get_settings",
    "job_view", "list_jobs",
    "load_config", "load_script", "load_tasklist", "parse_tasklist", "run_agent",
    "cancel_job", "resume_job", "job_costs", "create_replay", "ReplayReport",
    "JobCancelled", "ReplayDiverged", "RemoteUnavailable", "JobRepository",
    "repository_for_input", "Sandbox", "SandboxMode", "Environment", "Confinement",
    "run_confined", "EnvironmentPlan", "plan_environment", "ensure_environment",
    "tier_access", "Redactor", "SandboxUnavailable", "NoModelAvailable", "SetupFailed",
    "ModelUnreachable", "examine", "ModelFailure", "job_logs", "prune", "PruneReport",
    "live_workers", "RequestKind", "make_plan", "Plan", "load_specs", "submit_request",
    "RequestSubmission", "approve_job", "reject_job", "plan_job",
    "PlanUnreadable", "AgentDefinition", "load_agents", "Permissions", "PermissionRules",
    "McpServer", "open_mcp_tools", "text_tool_calls", "AgentFileError", "ToolSourceError",
    "ModelRefused",
}  # fmt: skip


def test_public_api_is_pinned_and_importable() -> None:
    assert set(merlin_flow.__all__) == PINNED_API
    for name in merlin_flow.__all__:
        assert getattr(merlin_flow, name) is not None


def test_errors_share_one_base_and_input_errors_exit_2() -> None:
    from merlin_flow import errors

    classes = [
        obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, Exception)
    ]
    assert all(issubclass(cls, errors.MerlinError) for cls in classes)
    assert errors.TaskListError("x").exit_code == 2
    assert errors.AgentError("x").exit_code == 1


def test_help_does_not_import_heavy_modules() -> None:
    """`merlin --help` must not pay for litellm, Celery or SQLAlchemy (seconds of import)."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from merlin_flow.cli import app\n"
        "result = CliRunner().invoke(app, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'demo' in result.output\n"
        "heavy = [m for m in ('litellm', 'celery', 'sqlalchemy', 'kombu') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
