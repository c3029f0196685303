"""Where a tier's requests go, and with which key: decided at submission, kept with the job.

A tier names its endpoint with `api_base` (and `api_version`), and the variable holding
its key with `api_key_env`. A tier that names no endpoint takes, at submission, the URL
its provider's variable holds in the submitter's environment (``OPENAI_BASE_URL``...),
or a local server's default address. The job stores the result, so a worker with
another environment still calls the endpoint the job was submitted for.

Keys never travel with the job: each worker reads the variable by name. A tier at its
own `api_base` with no `api_key_env` is sent no key at all, so the worker's
``OPENAI_API_KEY`` is never handed to a server it was not meant for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from merlin_flow.config import SCRIPTED_PREFIX, MerlinConfig, Tier

BASE_VARIABLES: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_BASE_URL", "OPENAI_API_BASE"),
    "text-completion-openai": ("OPENAI_BASE_URL", "OPENAI_API_BASE"),
    "anthropic": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_BASE"),
    "azure": ("AZURE_API_BASE",),
    "azure_ai": ("AZURE_AI_API_BASE",),
    "gemini": ("GEMINI_API_BASE",),
    "openrouter": ("OPENROUTER_API_BASE",),
    "ollama": ("OLLAMA_API_BASE",),
    "ollama_chat": ("OLLAMA_API_BASE",),
    "hosted_vllm": ("HOSTED_VLLM_API_BASE",),
    "lm_studio": ("LM_STUDIO_API_BASE",),
    "llamafile": ("LLAMAFILE_API_BASE",),
}
"""Variables litellm reads a provider's endpoint from, in the order it reads them."""

KEY_VARIABLES: dict[str, str] = {
    "openai": "OPENAI_API_KEY",
    "text-completion-openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "azure": "AZURE_API_KEY",
    "azure_ai": "AZURE_AI_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
}
"""The variable a provider's key is usually in (paired with an endpoint variable)."""

VERSION_VARIABLES: dict[str, str] = {"azure": "AZURE_API_VERSION"}

LOCAL_SERVERS: dict[str, str] = {
    "ollama": "http://localhost:11434",
    "ollama_chat": "http://localhost:11434",
    "lm_studio": "http://localhost:1234/v1",
    "llamafile": "http://127.0.0.1:8080/v1",
}
"""Providers served by a local server, and where it listens by default."""

KEYED_AT_ANY_ENDPOINT = frozenset({"azure", "azure_ai", "ollama", "ollama_chat"})
"""Providers whose `api_base` is always their own service: their usual key variable
is read even when the tier names an endpoint."""

NO_KEY = "no-key"
"""Sent as the key to a tier's own endpoint when it names no `api_key_env` (OpenAI-style
clients refuse to send a request without one; local servers ignore it)."""


def endpoint_from_environment(tier: Tier, environ: Mapping[str, str]) -> str | None:
    """The endpoint ``tier`` would reach with ``environ``: its variable, or a local default."""
    for variable in BASE_VARIABLES.get(tier.provider, ()):
        if environ.get(variable):
            return environ[variable]
    return LOCAL_SERVERS.get(tier.provider)


def pin_endpoints(config: MerlinConfig, environ: Mapping[str, str] | None = None) -> MerlinConfig:
    """``config`` with every tier's endpoint written down, as the submitter sees it.

    A tier that takes its endpoint from a variable also takes the key variable paired
    with it, when the submitter has that one set (as litellm would have used it).
    """
    environ = os.environ if environ is None else environ
    tiers = []
    for tier in config.tiers:
        if tier.is_scripted or tier.api_base is not None:
            tiers.append(tier)
            continue
        changes: dict[str, str] = {}
        base = endpoint_from_environment(tier, environ)
        if base is not None:
            changes["api_base"] = base
            key_variable = KEY_VARIABLES.get(tier.provider)
            if tier.api_key_env is None and key_variable and environ.get(key_variable):
                changes["api_key_env"] = key_variable
        version_variable = VERSION_VARIABLES.get(tier.provider)
        if tier.api_version is None and version_variable and environ.get(version_variable):
            changes["api_version"] = environ[version_variable]
        tiers.append(tier.model_copy(update=changes))
    return config.model_copy(update={"tiers": tiers})


def describe(tier: Tier) -> str:
    """``tier`` for messages: its name, model and endpoint."""
    if tier.is_scripted:  # `scripted/` + an absolute path: name the script, one slash
        return f"tier {tier.name!r} (scripted model {tier.model.removeprefix(SCRIPTED_PREFIX)})"
    where = tier.api_base or "the provider's default endpoint"
    return f"tier {tier.name!r} ({tier.model} at {where})"


def api_key(tier: Tier, environ: Mapping[str, str] | None = None) -> str | None:
    """The key to send for ``tier``: None lets litellm read the provider's usual variable.

    Raises KeyError naming the variable when `api_key_env` is set but not to a value.
    """
    environ = os.environ if environ is None else environ
    if tier.api_key_env is not None:
        value = environ.get(tier.api_key_env)
        if not value:
            raise KeyError(tier.api_key_env)
        return value
    if tier.api_base is not None and tier.provider not in KEYED_AT_ANY_ENDPOINT:
        return NO_KEY
    return None
