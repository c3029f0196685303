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
    "Sandbox": "merlin_flow.config",
    "SandboxMode": "merlin_flow.config",
    "Environment": "merlin_flow.config",
    "Settings": "merlin_flow.settings",
    "get_settings": "merlin_flow.settings",
    # Statuses
    "JobStatus": "merlin_flow.store.status",
    "StepStatus": "merlin_flow.store.status",
    "AttemptStatus": "merlin_flow.store.status",
    "Phase": "merlin_flow.store.status",
    # Jobs
    "submit_job": "merlin_flow.submission",
    "Submission": "merlin_flow.submission",
    "create_job": "merlin_flow.submission",
    "job_view": "merlin_flow.jobs",
    "list_jobs": "merlin_flow.jobs",
    "enqueue_job": "workers.canvas",
    "cancel_job": "merlin_flow.control",
    "resume_job": "merlin_flow.control",
    "job_costs": "merlin_flow.costs",
    "job_logs": "merlin_flow.jobs",
    "prune": "merlin_flow.pruning",
    "PruneReport": "merlin_flow.pruning",
    "live_workers": "merlin_flow.presence",
    "JobRepository": "merlin_flow.repository",
    "repository_for_input": "merlin_flow.repository",
    # Requests and plans
    "RequestKind": "merlin_flow.requests",
    "make_plan": "merlin_flow.planner",
    "Plan": "merlin_flow.planner",
    "load_specs": "merlin_flow.specs",
    "submit_request": "merlin_flow.requesting",
    "RequestSubmission": "merlin_flow.requesting",
    "approve_job": "merlin_flow.requesting",
    "reject_job": "merlin_flow.requesting",
    "plan_job": "merlin_flow.requesting",
    # Where step commands run
    "Confinement": "merlin_flow.sandbox",
    "run_confined": "merlin_flow.sandbox",
    "EnvironmentPlan": "merlin_flow.environment",
    "plan_environment": "merlin_flow.environment",
    "ensure_environment": "merlin_flow.environment",
    "tier_access": "merlin_flow.credentials",
    "Redactor": "merlin_flow.redaction",
    # Journal and replay
    "create_replay": "merlin_flow.replay",
    "ReplayReport": "merlin_flow.replay",
    # Agent, tools, models
    "Toolbox": "merlin_flow.tools",
    "run_agent": "merlin_flow.agent",
    "Script": "merlin_flow.scripted",
    "load_script": "merlin_flow.scripted",
    # Escalation
    "AttemptKind": "merlin_flow.escalation",
    "Action": "merlin_flow.escalation",
    "Decision": "merlin_flow.escalation",
    "Failure": "merlin_flow.escalation",
    "FailureKind": "merlin_flow.escalation",
    "classify": "merlin_flow.model_errors",
    "examine": "merlin_flow.model_errors",
    "ModelFailure": "merlin_flow.model_errors",
    "decide": "merlin_flow.escalation",
    # Routing
    "Complexity": "merlin_flow.routing",
    "Routing": "merlin_flow.config",
    "start_tier": "merlin_flow.routing",
    # Agents, permissions, tools
    "AgentDefinition": "merlin_flow.agent_files",
    "load_agents": "merlin_flow.agent_files",
    "Permissions": "merlin_flow.permissions",
    "PermissionRules": "merlin_flow.tool_config",
    "McpServer": "merlin_flow.tool_config",
    "open_mcp_tools": "merlin_flow.mcp_tools",
    "text_tool_calls": "merlin_flow.tool_text",
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
