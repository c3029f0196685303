"""Can a tier's model be used from here: its key present, its server answering.

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
from merlin_flow.models.endpoints import (
    BASE_VARIABLES,
    KEYED_AT_ANY_ENDPOINT,
    api_key,
    describe,
    endpoint_from_environment,
)

CONNECT_TIMEOUT = 1.0


def tier_access(tier: Tier) -> str | None:
    """None when ``tier`` can be used from this process; otherwise what is missing."""
    if tier.is_scripted:
        return None
    try:
        api_key(tier)
    except KeyError as exc:
        return (
            f"{describe(tier)}: api_key_env names {exc.args[0]}, which is not set here; "
            "set it in the environment of merlin and its workers"
        )
    base = tier.api_base or endpoint_from_environment(tier, os.environ)
    if base is not None:
        if not _answers(base):
            if tier.api_base is not None:  # the environment's variables would not apply
                fix = "start it, or correct the tier's api_base"
            else:
                where = " or ".join(["the tier's api_base", *BASE_VARIABLES.get(tier.provider, ())])
                fix = f"start it, or set {where} to where it runs"
            return f"tier {tier.name!r} ({tier.model}): no server answers at {base}; {fix}"
        if tier.api_key_env is not None or tier.provider not in KEYED_AT_ANY_ENDPOINT:
            return None  # its key is checked above, or it is sent none
    from merlin_flow.models.llm import litellm_module

    try:
        report = litellm_module().validate_environment(model=tier.model, api_base=base)
    except Exception as exc:  # litellm raises assorted errors for unknown providers
        return f"{describe(tier)}: litellm cannot check this model: {exc}"
    missing = [str(key) for key in report.get("missing_keys") or []]
    if not report.get("keys_in_environment") and missing:
        return (
            f"{describe(tier)}: missing credentials: set {', '.join(missing)} in the "
            "environment of merlin and its workers, or name the variable with api_key_env"
        )
    empty = _empty_keys(tier.provider)
    if report.get("keys_in_environment") and empty:
        return (
            f"{describe(tier)}: {', '.join(empty)} is set but empty (as compose sets "
            "`${VAR:-}` when your shell has none); give it the key, or unset it"
        )
    return None


def _empty_keys(provider: str) -> list[str]:
    """The provider's key variables that are set to nothing, when none of them has a value.

    litellm counts a variable that is set as present, empty or not; the call then fails
    for want of a key.
    """
    prefix = provider.upper().replace("-", "_") + "_"
    keys = {
        name: value
        for name, value in os.environ.items()
        if name.startswith(prefix) and name.endswith(("_KEY", "_TOKEN"))
    }
    if any(value.strip() for value in keys.values()):
        return []
    return sorted(keys)


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
