"""Process settings from the environment (``MERLIN_*`` variables).

These say where state lives and how this process reaches it; what a job does is in
``merlin.toml`` (see ``merlin_flow.config``). With no variable set, everything lives under
``~/.merlin`` and needs no server.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from merlin_flow.config_files import SYSTEM_CONFIG


class Settings(BaseSettings):
    """Where merlin_flow keeps its state and how often its background work runs."""

    model_config = SettingsConfigDict(env_prefix="MERLIN_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".merlin")
    """MERLIN_HOME: the embedded database, the embedded broker, worktrees and patches."""
    database_url: str | None = None
    """MERLIN_DATABASE_URL: any SQLAlchemy URL; default SQLite at $MERLIN_HOME/merlin.db."""
    broker_url: str | None = None
    """MERLIN_BROKER_URL: a Celery broker URL; default sqla+sqlite at $MERLIN_HOME/broker.db."""
    broker_poll_interval: float = Field(default=0.1, gt=0)
    """Seconds between polls of the embedded SQL broker (see docs/operations.md)."""
    sweep_interval: float = Field(default=15.0, gt=0)
    """Seconds between recovery sweeps in each worker."""
    handoff_seconds: float = Field(default=300.0, gt=0)
    """How long a queued step may wait for a worker before the sweep enqueues it again."""
    min_free_mb: float = Field(default=50.0, ge=0)
    """MERLIN_MIN_FREE_MB: free space under MERLIN_HOME below which a step does not start
    (its job is parked, waiting for space) and at which a job parked for space resumes."""
    system_config: Path = SYSTEM_CONFIG
    """MERLIN_SYSTEM_CONFIG: the system's merlin.toml, read by every command that loads a
    configuration, beneath the user's and the project's (see docs/reference.md)."""
    uv_cache_dir: Path | None = None
    """MERLIN_UV_CACHE_DIR: uv's package cache for environment setup; default
    $MERLIN_HOME/cache/uv (shared by setups only, never mounted into a step)."""
    ui_allowed_hosts: str = ""
    """MERLIN_UI_ALLOWED_HOSTS: the names, comma-separated (``NAME`` or ``NAME:PORT``),
    ``merlin ui`` answers to besides its own address: a proxy's (see docs/dashboard.md)."""

    @cached_property
    def home_dir(self) -> Path:
        """MERLIN_HOME, expanded and absolute."""
        return self.home.expanduser().resolve()

    @property
    def database(self) -> str:
        """The SQLAlchemy URL of merlin's own store."""
        return self.database_url or f"sqlite:///{self.home_dir / 'merlin.db'}"

    @property
    def broker(self) -> str:
        """The Celery broker URL."""
        return self.broker_url or f"sqla+sqlite:///{self.home_dir / 'broker.db'}"

    @property
    def broker_is_embedded(self) -> bool:
        """True when the broker is kombu's SQL transport (no fanout, no redelivery)."""
        return self.broker.startswith("sqla+")

    @property
    def worktrees_dir(self) -> Path:
        """Where attempt and verify worktrees are created."""
        return self.home_dir / "worktrees"

    @property
    def uv_cache(self) -> Path:
        """The package cache of uv, used by environment setup."""
        return (self.uv_cache_dir or self.home_dir / "cache" / "uv").expanduser().resolve()

    @property
    def npm_cache(self) -> Path:
        """The package cache of npm, used by the setup of Node projects."""
        return (self.home_dir / "cache" / "npm").expanduser().resolve()

    @property
    def envs_dir(self) -> Path:
        """Where built project environments are kept."""
        return self.home_dir / "envs"

    @property
    def jobs_dir(self) -> Path:
        """Where each job's patch and summary are written."""
        return self.home_dir / "jobs"


def get_settings() -> Settings:
    """Read the settings from the current environment."""
    return Settings()
