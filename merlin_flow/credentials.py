"""Can a tier's model be used from here: its key present, or its local server answering.

Checked before a job is accepted (``merlin run``/``submit`` refuse when no tier can be
used), before an attempt's first call (an attempt on a tier with no key fails at once,
with no call, and is never retried or "fixed"), and by ``merlin doctor``.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from merlin_flow.config import MerlinConfig, Tier
from merlin_flow.errors import NoModelAvailable

LOCAL_SERVERS = {
    "ollama": ("OLLAMA_API_BASE", "http://localhost:11434"),
    "ollama_chat": ("OLLAMA_API_BASE", "http://localhost:11434"),
    "lm_studio": ("LM_STUDIO_API_BASE", "http://localhost:1234/v1"),
    "hosted_vllm": ("HOSTED_VLLM_API_BASE", "http://localhost:8000/v1"),
}
"""Providers served by a local server: the variable naming its URL, and its default."""
CONNECT_TIMEOUT = 1.0


def tier_access(tier: Tier) -> str | None:
    """None when ``tier`` can be used from this process; otherwise what is missing."""
    if tier.is_scripted:
        return None
    provider = tier.model.split("/", 1)[0] if "/" in tier.model else ""
    if provider in LOCAL_SERVERS:
        variable, default = LOCAL_SERVERS[provider]
        url = os.environ.get(variable) or default
        if not _answers(url):
            return (
                f"tier {tier.name!r} ({tier.model}): no server answers at {url}; start it, "
                f"or set {variable} to where it runs"
            )
        return None
    from merlin_flow.llm import litellm_module

    try:
        report = litellm_module().validate_environment(model=tier.model)
    except Exception as exc:  # litellm raises assorted errors for unknown providers
        return f"tier {tier.name!r} ({tier.model}): litellm cannot check this model: {exc}"
    missing = [str(key) for key in report.get("missing_keys") or []]
    if not report.get("keys_in_environment") and missing:
        return (
            f"tier {tier.name!r} ({tier.model}): missing credentials: set "
            f"{', '.join(missing)} in the environment of merlin and its workers"
        )
    return None


def require_a_usable_tier(config: MerlinConfig) -> None:
    """NoModelAvailable, listing every tier's problem, when no tier can be used."""
    problems = [problem for tier in config.tiers if (problem := tier_access(tier))]
    if len(problems) == len(config.tiers):
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise NoModelAvailable(
            f"no configured tier can be used, so no attempt could succeed:\n{lines}\n"
            "(`merlin doctor` checks every tier; docs/reference.md lists the tier settings)"
        )


def _answers(url: str) -> bool:
    """True when something accepts a TCP connection at ``url``'s host and port."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), CONNECT_TIMEOUT):
            return True
    except OSError:
        return False
