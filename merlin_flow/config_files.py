"""Which ``merlin.toml`` files a command reads, in which order, and how far each is trusted.

Lowest precedence first:

1. the shipped defaults (``config/merlin.toml``);
2. the system file, ``/etc/merlin/merlin.toml`` (``MERLIN_SYSTEM_CONFIG``): a machine's
   or a deployment's settings, trusted, any section;
3. the user's file, ``$MERLIN_HOME/merlin.toml``: ``[permissions]``, ``[agents]`` and
   ``[mcp_servers]`` only;
4. one overlay: ``--config FILE`` (or ``MERLIN_CONFIG``), trusted; otherwise the
   repository's own ``merlin.toml``, untrusted: it may tighten what steps may do, never
   loosen it, nor choose where the worker's model requests and keys go
   (``refuse_loosening``).

The ``[permissions]`` of the system and user files always apply: the overlay's rules are
added to theirs. ``merlin doctor`` prints this list (``describe``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from merlin_flow.errors import ConfigError
from merlin_flow.resources import resource_dir
from merlin_flow.tool_config import Sandbox

CONFIG_FILE_NAME = "merlin.toml"
SCRIPTED_PREFIX = "scripted/"
SYSTEM_CONFIG = Path("/etc/merlin") / CONFIG_FILE_NAME
"""The system file's default path; ``MERLIN_SYSTEM_CONFIG`` names another."""


class Layer(StrEnum):
    """Where a configuration file comes from, lowest precedence first."""

    DEFAULTS = "defaults"
    SYSTEM = "system"
    USER = "user"
    CONFIG = "--config"
    REPOSITORY = "repository"


TRUSTED = frozenset({Layer.DEFAULTS, Layer.SYSTEM, Layer.USER, Layer.CONFIG})
"""Layers whose files may loosen what steps may do."""


@dataclass(frozen=True)
class ConfigFile:
    """One place a configuration may come from, and whether it was read."""

    layer: Layer
    path: Path
    read: bool
    note: str = ""
    """Why it was not read ("absent", "--config replaces it"), or ""."""

    def describe(self) -> str:
        """One line: ``system /etc/merlin/merlin.toml (absent)``."""
        return f"{self.layer} {self.path}" + (f" ({self.note})" if self.note else "")


def config_files(
    repo: Path | None,
    config_path: Path | None,
    user_home: Path | None,
    system_file: Path | None,
) -> list[ConfigFile]:
    """Every place a command looks for configuration, lowest precedence first.

    ``config_path`` (``--config`` or ``MERLIN_CONFIG``) must exist: the caller checks it.
    ``user_home`` and ``system_file`` None: that layer is not consulted (the demo).
    """
    files = [ConfigFile(Layer.DEFAULTS, resource_dir("config") / CONFIG_FILE_NAME, True)]
    if system_file is not None:
        files.append(_maybe(Layer.SYSTEM, system_file))
    if user_home is not None:
        files.append(_maybe(Layer.USER, user_home / CONFIG_FILE_NAME))
    if config_path is not None:
        files.append(ConfigFile(Layer.CONFIG, config_path.expanduser().resolve(), True))
    if repo is not None:
        own = repo / CONFIG_FILE_NAME
        if config_path is not None:
            files.append(ConfigFile(Layer.REPOSITORY, own, False, "--config replaces it"))
        else:
            files.append(_maybe(Layer.REPOSITORY, own))
    return files


def _maybe(layer: Layer, path: Path) -> ConfigFile:
    path = path.expanduser()
    if path.is_file():
        return ConfigFile(layer, path.resolve(), True)
    return ConfigFile(layer, path, False, "not a file" if path.exists() else "absent")


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's tables; ConfigError naming the file when it cannot be read."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a merlin.toml") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def merge_tables(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` laid over ``base``: a table merges key by key, anything else replaces."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


REPOSITORY_PROVIDERS = frozenset(
    {
        "openai", "text-completion-openai", "anthropic", "azure", "azure_ai", "gemini",
        "openrouter", "ollama", "ollama_chat", "hosted_vllm", "lm_studio", "llamafile",
    }
)  # fmt: skip
"""The providers a repository's own tier may name (besides ``scripted/``): those whose
endpoint merlin knows (``merlin_flow.models.endpoints.BASE_VARIABLES``): their service,
or the URL their variable holds where the job is submitted. Another provider's model
string may name an endpoint itself (litellm sends ``huggingface/https://host/...`` there)."""
TIER_ENDPOINT_KEYS = ("api_base", "api_key_env", "api_version")
"""The tier settings that choose where its requests go and which key they carry."""
SANDBOX_LIMITS = ("max_file_size_mb", "max_memory_mb")


def refuse_loosening(
    overlay: dict[str, Any], beneath: dict[str, Any], source: Path, root: Path
) -> None:
    """A repository's own merlin.toml may tighten what steps may do, never loosen it.

    Its content is as untrusted as its code (a pull request can change it). ``beneath``
    is what the trusted files under it set (`[permissions]`: the strictest `default` of
    the system's and the user's). Refused, each named, as needing a --config file (or
    the system file):

    - turning the sandbox off, giving steps (or a step's own build) the network, passing
      variables in, raising a `[sandbox]` limit above the one beneath, an `allow` rule
      under `default = "deny"`, or a `url` MCP server (the worker itself, outside the
      sandbox, would talk to an address of the repository's choosing);
    - a tier's `api_base`, `api_key_env` or `api_version`, or a provider not in
      ``REPOSITORY_PROVIDERS``: the worker, outside the sandbox, would send its keys where
      the repository chooses. A repository's tiers are models at merlin's endpoints;
    - a scripted tier's script outside ``root``, the repository (``~``, an absolute path,
      ``..`` or a symlink out of it): its content reaches the model and error messages;
    - `[secrets] allow` patterns the files beneath do not allow.
    """
    sandbox, below = _table(overlay, "sandbox"), _table(beneath, "sandbox")
    loosened = [
        key
        for key, value in sandbox.items()
        if (key == "mode" and value != "bwrap")
        or (key == "network" and value is not False)
        or (key == "pass_env" and value)
    ]
    problems = [f"[sandbox] {', '.join(loosened)}"] if loosened else []
    raised = [
        f"[sandbox] {key} {value} (above the operator's {limit})"
        for key in SANDBOX_LIMITS
        if _number(value := sandbox.get(key))
        and _number(limit := below.get(key, Sandbox.model_fields[key].default))
        and value > limit
    ]
    problems += raised
    if _table(overlay, "environment").get("attempt_network") not in (None, False):
        problems.append("[environment] attempt_network")
    user_default = _table(beneath, "permissions").get("default")
    allows = _table(overlay, "permissions").get("allow")
    if user_default == "deny" and allows:
        problems.append(
            '[permissions] allow (the system\'s or your own file sets default = "deny")'
        )
    servers = _table(overlay, "mcp_servers")
    remote = [n for n, s in servers.items() if isinstance(s, dict) and s.get("url") is not None]
    if remote:
        problems.append(f"[mcp_servers] with a url ({', '.join(sorted(remote))})")
    endpoints, outside = _tier_problems(overlay.get("tiers"), source.parent, root)
    allowed, kept = (_table(data, "secrets").get("allow") for data in (overlay, beneath))
    kept = kept if isinstance(kept, list) else []
    exempt = [str(p) for p in allowed if p not in kept] if isinstance(allowed, list) else []
    groups = (
        (problems, "would loosen the sandbox"),
        (endpoints, "would choose where the worker sends model requests and its keys"),
        (outside, "would read a script outside the repository"),
        ([f"[secrets] allow ({', '.join(exempt)})"] if exempt else [], "would exempt paths "
         "from the scan for key formats"),
    )  # fmt: skip
    said = [f"{'; '.join(found)} {why}" for found, why in groups if found]
    if said:
        also = ", or in the system file" if raised or endpoints or outside or exempt else ""
        raise ConfigError(
            f"{source}: {'; '.join(said)}, and a repository's own merlin.toml may not (its "
            "content is untrusted, like its code): put these settings in a file you pass "
            f"with --config{also}"
        )


def _tier_problems(tiers: Any, folder: Path, root: Path) -> tuple[list[str], list[str]]:
    """A repository's tiers that choose an endpoint or a key, and scripts outside ``root``.

    ``folder`` is where the file's relative script paths start (its own folder).
    """
    endpoints, outside = [], []
    for tier in tiers if isinstance(tiers, list) else []:
        if not isinstance(tier, dict):
            continue  # validation says what is wrong with it
        name, model = tier.get("name"), tier.get("model")
        keys = [key for key in TIER_ENDPOINT_KEYS if key in tier]
        if keys:
            endpoints.append(f"[[tiers]] {', '.join(keys)} (tier {name!r})")
        if not isinstance(model, str):
            continue
        provider, _, rest = model.partition("/")
        if model.startswith(SCRIPTED_PREFIX):
            if not _inside(model.removeprefix(SCRIPTED_PREFIX), folder, root):
                outside.append(f"[[tiers]] model {model!r} (tier {name!r})")
        elif provider and rest and provider not in REPOSITORY_PROVIDERS:
            endpoints.append(
                f"[[tiers]] model {model!r} (tier {name!r}: provider {provider!r}, whose "
                "endpoint merlin does not know)"
            )
    return endpoints, outside


def _inside(script: str, folder: Path, root: Path) -> bool:
    """Whether ``script``, relative to ``folder``, is a file inside ``root`` (symlinks read)."""
    if script.startswith("~") or Path(script).is_absolute():
        return False
    try:
        return (folder / script).resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError, ValueError):  # a NUL byte...: the loader says so
        return True


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    """The table ``data[key]``; {} when it is absent or not a table (validation says so)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}
