"""Which ``merlin.toml`` files a command reads, in which order, and how far each is trusted.

Lowest precedence first:

1. the shipped defaults (``config/merlin.toml``);
2. the system file, ``/etc/merlin/merlin.toml`` (``MERLIN_SYSTEM_CONFIG``): a machine's
   or a deployment's settings, trusted, any section;
3. the user's file, ``$MERLIN_HOME/merlin.toml``: ``[permissions]``, ``[agents]`` and
   ``[mcp_servers]`` only;
4. one overlay: ``--config FILE`` (or ``MERLIN_CONFIG``), trusted; otherwise the
   repository's own ``merlin.toml``, untrusted: it may tighten what steps may do, never
   loosen it (``merlin_flow.tool_config.refuse_loosening``).

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

CONFIG_FILE_NAME = "merlin.toml"
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
