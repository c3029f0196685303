"""merlin_flow: AI coding jobs as durable workflows.

A TaskList of typed steps runs as a Celery chain; each step is an LLM agent working in a
git worktree, checked by an exit command, fixed or escalated to a stronger model tier.

The public API is listed in ``__all__``, grouped by concept. Names are imported lazily so
that ``import merlin_flow`` (and ``merlin --help``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # TaskLists
    "TaskList": "merlin_flow.tasklist",
    "TaskStep": "merlin_flow.tasklist",
    "StepType": "merlin_flow.tasklist",
    "load_tasklist": "merlin_flow.tasklist",
    "parse_tasklist": "merlin_flow.tasklist",
    # Configuration
    "MerlinConfig": "merlin_flow.config",
    "Tier": "merlin_flow.config",
    "Limits": "merlin_flow.config",
    "load_config": "merlin_flow.config",
    "Sandbox": "merlin_flow.tool_config",
    "SandboxMode": "merlin_flow.tool_config",
    "Environment": "merlin_flow.tool_config",
    "Settings": "merlin_flow.settings",
    "get_settings": "merlin_flow.settings",
    # Statuses
    "JobStatus": "merlin_flow.store.status",
    "StepStatus": "merlin_flow.store.status",
    "AttemptStatus": "merlin_flow.store.status",
    "Phase": "merlin_flow.store.status",
    # Jobs
    "submit_job": "merlin_flow.jobs.submission",
    "Submission": "merlin_flow.jobs.submission",
    "create_job": "merlin_flow.jobs.submission",
    "job_view": "merlin_flow.jobs.views",
    "list_jobs": "merlin_flow.jobs.views",
    "enqueue_job": "workers.canvas",
    "cancel_job": "merlin_flow.jobs.control",
    "resume_job": "merlin_flow.jobs.control",
    "job_costs": "merlin_flow.jobs.costs",
    "job_logs": "merlin_flow.jobs.logs",
    "prune": "merlin_flow.jobs.pruning",
    "PruneReport": "merlin_flow.jobs.pruning",
    "live_workers": "merlin_flow.engine.presence",
    "JobRepository": "merlin_flow.workspace.repository",
    "repository_for_input": "merlin_flow.workspace.repository",
    # Requests and plans
    "RequestKind": "merlin_flow.planning.requests",
    "make_plan": "merlin_flow.planning.planner",
    "Plan": "merlin_flow.planning.planner",
    "load_specs": "merlin_flow.planning.specs",
    "submit_request": "merlin_flow.jobs.requesting",
    "RequestSubmission": "merlin_flow.jobs.requesting",
    "approve_job": "merlin_flow.jobs.requesting",
    "reject_job": "merlin_flow.jobs.decisions",
    "plan_job": "merlin_flow.jobs.requesting",
    # Where step commands run
    "Confinement": "merlin_flow.workspace.sandbox",
    "run_confined": "merlin_flow.workspace.sandbox",
    "EnvironmentPlan": "merlin_flow.workspace.environment",
    "plan_environment": "merlin_flow.workspace.environment",
    "ensure_environment": "merlin_flow.workspace.environment",
    "tier_access": "merlin_flow.models.credentials",
    "Redactor": "merlin_flow.store.redaction",
    # Journal and replay
    "create_replay": "merlin_flow.jobs.replay",
    "ReplayReport": "merlin_flow.jobs.replay",
    # Agent, tools, models
    "Toolbox": "merlin_flow.tools.toolbox",
    "run_agent": "merlin_flow.agents.loop",
    "Script": "merlin_flow.scripts",
    "load_script": "merlin_flow.scripts",
    # Escalation
    "AttemptKind": "merlin_flow.failures",
    "Action": "merlin_flow.failures",
    "Decision": "merlin_flow.failures",
    "Failure": "merlin_flow.failures",
    "FailureKind": "merlin_flow.failures",
    "classify": "merlin_flow.models.diagnosis",
    "examine": "merlin_flow.models.diagnosis",
    "ModelFailure": "merlin_flow.models.diagnosis",
    "decide": "merlin_flow.failures",
    # Routing
    "Complexity": "merlin_flow.planning.routing",
    "Routing": "merlin_flow.config",
    "start_tier": "merlin_flow.planning.routing",
    # Agents, permissions, tools
    "AgentDefinition": "merlin_flow.agents.definitions",
    "load_agents": "merlin_flow.agents.definitions",
    "Permissions": "merlin_flow.tools.permissions",
    "PermissionRules": "merlin_flow.tool_config",
    "McpServer": "merlin_flow.tool_config",
    "open_mcp_tools": "merlin_flow.tools.mcp",
    "text_tool_calls": "merlin_flow.tools.text_calls",
    # Errors
    "MerlinError": "merlin_flow.errors",
    "InputError": "merlin_flow.errors",
    "TaskListError": "merlin_flow.errors",
    "ConfigError": "merlin_flow.errors",
    "RepositoryError": "merlin_flow.errors",
    "JobNotFoundError": "merlin_flow.errors",
    "StoreError": "merlin_flow.errors",
    "GitError": "merlin_flow.errors",
    "StepFailure": "merlin_flow.errors",
    "AgentError": "merlin_flow.errors",
    "BudgetExceeded": "merlin_flow.errors",
    "JobCancelled": "merlin_flow.errors",
    "LeaseLost": "merlin_flow.errors",
    "ReplayDiverged": "merlin_flow.errors",
    "RemoteUnavailable": "merlin_flow.errors",
    "SandboxUnavailable": "merlin_flow.errors",
    "NoModelAvailable": "merlin_flow.errors",
    "SetupFailed": "merlin_flow.errors",
    "ModelUnreachable": "merlin_flow.errors",
    "PlanUnreadable": "merlin_flow.errors",
    "AgentFileError": "merlin_flow.errors",
    "ToolSourceError": "merlin_flow.errors",
    "ModelRefused": "merlin_flow.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'merlin_flow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
