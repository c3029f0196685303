"""Job configuration: model tiers, exit commands and limits, read from ``merlin.toml``.

The shipped defaults are ``config/merlin.toml``. A repository's own ``merlin.toml`` (or
``--config FILE``) is laid over them: ``[[tiers]]`` replaces the whole list (and drops
the default ``[routing]``, which names the default tiers), and the ``[exit_commands]``,
``[limits]`` and ``[routing]`` tables merge key by key. The resolved configuration is
stored with each job, so every worker runs the job with the configuration it was
submitted with.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from merlin_flow.config_files import SCRIPTED_PREFIX as SCRIPTED_PREFIX
from merlin_flow.config_files import (
    ConfigFile,
    Layer,
    config_files,
    merge_tables,
    read_toml,
    refuse_loosening,
)
from merlin_flow.errors import ConfigError
from merlin_flow.scripts import load_script
from merlin_flow.tasklist import StepType
from merlin_flow.tool_config import (
    SERVER_NAME,
    AgentSettings,
    Environment,
    McpServer,
    PermissionRules,
    Sandbox,
    SecretScan,
    merge_rules,
    user_sections,
)

DEFAULT_MAX_TOKENS = 4096
"""Completion tokens a call may produce when its tier sets no `max_tokens`."""


class Tier(BaseModel):
    """One model tier: a litellm model string with its price and limits."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    """Name used in TaskLists (`tier:`), reports and escalation records."""
    model: str = Field(min_length=1)
    """litellm model string, e.g. `anthropic/claude-sonnet-4-5` or `scripted/local.yaml`."""
    price_in: float | None = Field(default=None, ge=0)
    """USD per million input tokens; overrides litellm's price map when set."""
    price_out: float | None = Field(default=None, ge=0)
    """USD per million output tokens; overrides litellm's price map when set."""
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, gt=0)
    """Upper bound on completion tokens per call. Without one, a local server generates
    until its context is full."""
    timeout: float = Field(default=600.0, gt=0)
    """Seconds before one model request is abandoned (see also `limits.turn_timeout`)."""
    api_base: str | None = None
    """URL of the endpoint the tier's requests go to, e.g. `http://127.0.0.1:8080/v1` for
    a llama.cpp server. Unset: the provider's own, or the URL its variable (such as
    `OPENAI_BASE_URL`) held where the job was submitted. Stored with the job, so every
    worker calls the same endpoint."""
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Name of the environment variable that holds the tier's API key on the workers (never
    the key itself). Unset: the provider's usual variable (such as `OPENAI_API_KEY`)."""
    api_version: str | None = None
    """API version, for providers that take one (Azure OpenAI)."""
    step_types: list[StepType] = Field(default_factory=list)
    """Step types this tier takes (empty: every type). Routing and escalation pass over a
    tier for other types, e.g. a coder model for Feature/Refactor/Test steps only."""
    context_window: int | None = Field(default=None, ge=1024)
    """Tokens the model accepts in one request (its input window). Unset: litellm's
    `max_input_tokens` for the model, else a floor for unmapped models (docs/context.md)."""

    @field_validator("model")
    @classmethod
    def _provider_prefix(cls, model: str) -> str:
        provider, _, name = model.partition("/")
        if not provider or not name:
            raise ValueError(
                f"model {model!r} names no provider: write it as provider/model, e.g. "
                f"openai/{model.strip('/') or 'gpt-4o-mini'} for an OpenAI-compatible server "
                "or anthropic/claude-sonnet-4-5 (docs/models.md)"
            )
        return model

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"api_base {url!r} is not an http:// or https:// URL")
        return url

    @property
    def provider(self) -> str:
        """The litellm provider: the model string's prefix (`openai`, `anthropic`...)."""
        return self.model.split("/", 1)[0]

    def serves(self, step_type: StepType) -> bool:
        """True when steps of ``step_type`` may run on this tier."""
        return not self.step_types or step_type in self.step_types

    @property
    def is_scripted(self) -> bool:
        """True for the offline scripted model."""
        return self.model.startswith(SCRIPTED_PREFIX)


class Limits(BaseModel):
    """Bounds on how hard merlin tries, and how it detects lost workers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    fix_attempts: int = Field(default=1, ge=0)
    """Fix attempts on the same tier after a failed verification, before escalating."""
    max_retry_attempts: int = Field(default=2, ge=0)
    """Retries of a model call that failed transiently (rate limit, timeout, a 5xx that
    did not recur). Each retry is one HTTP request: the provider client never retries."""
    retry_base_delay: float = Field(default=0.5, ge=0)
    """Seconds before the first retry of a transient failure; doubled for each next one."""
    turn_timeout: float = Field(default=900.0, gt=0)
    """Seconds one model turn may take, retries and their waits included; each request
    gets what is left of it (at most the tier's `timeout`)."""
    max_turns: int = Field(default=20, ge=1)
    """Model replies per attempt before the attempt fails with 'turn limit'."""
    exit_command_timeout: float = Field(default=600.0, gt=0)
    """Seconds an exit command may run before its whole process group is killed."""
    tool_command_timeout: float = Field(default=120.0, gt=0)
    """Upper bound, in seconds, on one `run_command` tool call."""
    max_recoveries: int = Field(default=3, ge=0)
    """Counted losses of a step's worker before it is parked as a poison step (a loss
    counts only when no other worker was lost since the step's previous one)."""
    expected_completion_tokens: int = Field(default=500, ge=0)
    """Completion tokens a job's first call is assumed to cost, for budget checks."""
    lease_seconds: float = Field(default=60.0, gt=0)
    """A worker's claim on a step lasts this long; it renews it every third of it."""
    max_parallel_steps: int = Field(default=4, ge=1)
    """Steps of one job that may run at once (those whose dependencies have passed)."""


class Routing(BaseModel):
    """Which tier a step starts on, by its complexity (see merlin_flow.planning.routing)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    medium: str | None = None
    """Tier for medium steps; the cheapest tier when unset."""
    complex: str | None = None
    """Tier for complex steps; the cheapest tier when unset."""
    learn: bool = True
    """Start a step on the tier the journal says is cheapest for its kind of step in its
    repository, once it holds enough evidence (see merlin_flow.planning.route_learning)."""
    learn_after: float = Field(default=3.0, gt=0)
    """How much evidence (similar finished steps, weighted) the journal needs before it
    overrides the rules above."""


class Planning(BaseModel):
    """How a request in plain words is planned (`[planning]`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    tier: str | None = None
    """The tier whose model plans; the first tier when unset."""
    max_steps: int = Field(default=8, ge=1, le=50)
    """The most steps a plan may have; a longer one is sent back once, then replaced."""
    context_tokens: int = Field(default=6000, ge=500)
    """The most the repository's context (attached files, README, file tree) may take of
    the planner's prompt, in tokens (4 characters each)."""


class Specs(BaseModel):
    """Where the project's specs are and how many go with a request (`[specs]`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    paths: list[str] = Field(default_factory=lambda: ["specs"])
    """Folders (or files) of Markdown specs, relative to the repository's root."""
    top: int = Field(default=3, ge=1, le=20)
    """How many of the best-scoring specs go with a request."""
    scorer: Literal["overlap", "tfidf"] = "overlap"
    """How specs are scored against a request: shared rare words (`overlap`), or TF-IDF
    cosine similarity (`tfidf`; docs/specs.md)."""
    check: Literal["off", "warn", "enforce"] = "off"
    """The spec check after a step's exit command passes: a model compares the attempt's
    diff with the relevant specs' constraints. `enforce` fails the verification on a
    violation; `warn` records it and passes; `off` checks only steps with `spec_check`."""
    check_tier: str | None = None
    """The tier whose model makes the spec check; the planning tier when unset."""


class MerlinConfig(BaseModel):
    """Everything a job needs to know about models, exit commands and limits."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    tiers: list[Tier] = Field(min_length=1)
    """Model tiers, cheapest first; escalation moves down this list."""
    exit_commands: dict[StepType, str] = Field(default_factory=dict)
    """Exit command per step type, overriding the project kind's defaults."""
    shell: bool = False
    """Run exit commands through `/bin/sh -c` instead of splitting them with shlex."""
    budget_usd: float | None = Field(default=None, gt=0)
    """Default budget of a job in USD (`--budget` overrides it); no limit when unset."""
    response_cache: bool = False
    """Answer a request identical to an earlier one (same model, messages and tools; all
    calls are made at temperature 0) from the journal, across jobs, at no cost."""
    limits: Limits = Field(default_factory=Limits)
    """Retry, turn and timeout limits."""
    routing: Routing = Field(default_factory=Routing)
    """Starting tier by step complexity (simple steps always start on the cheapest)."""
    environment: Environment = Field(default_factory=Environment)
    """How the project's environment is built (`[environment]`)."""
    sandbox: Sandbox = Field(default_factory=Sandbox)
    """How step commands are confined (`[sandbox]`)."""
    planning: Planning = Field(default_factory=Planning)
    """How a request in plain words becomes a plan (`[planning]`)."""
    specs: Specs = Field(default_factory=Specs)
    """The project's specs (`[specs]`)."""
    permissions: PermissionRules = Field(default_factory=PermissionRules)
    """What a step's tools and commands may do (`[permissions]`)."""
    agents: AgentSettings = Field(default_factory=AgentSettings)
    """Which agent a step without `agent:` gets (`[agents]`)."""
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)
    """MCP servers whose tools steps may use (`[mcp_servers.NAME]`)."""
    secrets: SecretScan = Field(default_factory=SecretScan)
    """Paths whose key formats an attempt may commit (`[secrets]`)."""
    source: str | None = None
    """The file the configuration was read from (set by the loader)."""

    @model_validator(mode="after")
    def _unique_tier_names(self) -> Self:
        names = [tier.name for tier in self.tiers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(duplicates)}")
        for level in ("medium", "complex"):
            name = getattr(self.routing, level)
            if name is not None and name not in names:
                raise ValueError(
                    f"routing.{level} names unknown tier {name!r}; tiers: {', '.join(names)}"
                )
        if self.planning.tier is not None and self.planning.tier not in names:
            raise ValueError(
                f"planning.tier names unknown tier {self.planning.tier!r}; "
                f"tiers: {', '.join(names)}"
            )
        if self.specs.check_tier is not None and self.specs.check_tier not in names:
            raise ValueError(
                f"specs.check_tier names unknown tier {self.specs.check_tier!r}; "
                f"tiers: {', '.join(names)}"
            )
        bad = [name for name in self.mcp_servers if not SERVER_NAME.match(name)]
        if bad:
            raise ValueError(f"MCP server names may hold letters, digits, _ and - only: {bad}")
        unserved = [t.value for t in StepType if not any(tier.serves(t) for tier in self.tiers)]
        if unserved:
            raise ValueError(f"no tier takes step type(s) {', '.join(unserved)} (tiers.step_types)")
        return self

    def planning_tier(self) -> Tier:
        """The tier that plans: ``[planning] tier``, else the first."""
        name = self.planning.tier
        return self.tiers[self.tier_index(name)] if name is not None else self.tiers[0]

    def spec_check_tier(self) -> Tier:
        """The tier that makes the spec check: ``[specs] check_tier``, else the planner's."""
        name = self.specs.check_tier
        return self.tiers[self.tier_index(name)] if name is not None else self.planning_tier()

    def next_tier(self, index: int, step_type: StepType) -> int | None:
        """The first tier above ``index`` that takes ``step_type``; None when none does."""
        return next(
            (i for i in range(index + 1, len(self.tiers)) if self.tiers[i].serves(step_type)),
            None,
        )

    def tier_index(self, name: str) -> int:
        """Position of the tier called ``name``; ConfigError if there is none."""
        for index, tier in enumerate(self.tiers):
            if tier.name == name:
                return index
        known = ", ".join(tier.name for tier in self.tiers)
        raise ConfigError(f"unknown tier {name!r}; configured tiers: {known}")


def load_config(
    repo: Path | None = None,
    config_path: Path | None = None,
    user_home: Path | None = None,
    system_file: Path | None = None,
) -> MerlinConfig:
    """Load the configuration files of ``config_files``, lowest precedence first.

    ``system_file`` (``/etc/merlin/merlin.toml``) may set anything; the user's file
    (``<user_home>/merlin.toml``, ``MERLIN_HOME``) only `[permissions]`, `[agents]` and
    `[mcp_servers]`. Their `[permissions]` rules always apply (the overlay's are added to
    them); their other sections lie under the overlay: ``config_path``, else the
    repository's file, which may not loosen what steps may do.
    """
    if config_path is not None and not config_path.expanduser().is_file():
        raise ConfigError(f"config file not found: {config_path}")
    files = [f for f in config_files(repo, config_path, user_home, system_file) if f.read]
    data: dict[str, Any] = {}
    site_rules: list[tuple[Path, dict[str, Any]]] = []  # the system's, then the user's
    source: ConfigFile | None = None
    origin: dict[tuple[str, ...], Path] = {}  # which file set each section and key last
    for file in files:
        layer = read_toml(file.path)
        if file.layer is Layer.USER:
            layer = user_sections(layer, file.path)
        if file.layer in (Layer.SYSTEM, Layer.USER) and "permissions" in layer:
            site_rules.append((file.path, layer.pop("permissions")))
        if file.layer is Layer.REPOSITORY:
            refuse_loosening(layer, _beneath(data, site_rules), file.path, repo or file.path)
        _resolve_scripted_paths(layer, file.path.parent)
        if "tiers" in layer and "routing" not in layer:
            data.pop("routing", None)  # the routing beneath names the tiers beneath
        data = merge_tables(data, layer)
        for key, value in layer.items():
            origin[(key,)] = file.path
            if isinstance(value, dict):
                origin.update({(key, inner): file.path for inner in value})
        if file.layer in (Layer.CONFIG, Layer.REPOSITORY):
            source = file
    if source is not None:
        data["source"] = str(source.path)
    where, prefix = files[-1].path, []
    try:
        config = MerlinConfig.model_validate(data)
        for path, rules in reversed(site_rules):  # the user's under the overlay's, then
            where, prefix = path, ["permissions"]  # the system's under both
            config.permissions = merge_rules(
                PermissionRules.model_validate(rules), config.permissions
            )
    except ValidationError as exc:
        if not prefix:
            loc = tuple(str(part) for part in exc.errors()[0]["loc"])
            where = origin.get(loc[:2], origin.get(loc[:1], where))
        problems = "\n".join(
            f"  {'.'.join(str(p)[:60] for p in [*prefix, *err['loc']])}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise ConfigError(f"{where}: invalid configuration\n{problems}") from None
    check_scripted_files(config)
    return config


def _beneath(data: dict[str, Any], site_rules: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """What ``refuse_loosening`` compares a repository's file with: the trusted files'."""
    denies = any(isinstance(r, dict) and r.get("default") == "deny" for _, r in site_rules)
    return {**data, "permissions": {"default": "deny"} if denies else {}}


def check_scripted_files(config: MerlinConfig) -> None:
    """Raise ConfigError when a scripted tier's script is missing or invalid."""
    for tier in config.tiers:
        if tier.is_scripted:
            try:
                load_script(tier.model.removeprefix(SCRIPTED_PREFIX))
            except ConfigError as exc:
                raise ConfigError(f"tier {tier.name!r}: {exc}") from None


def scripts_inside(config: MerlinConfig, folder: Path) -> list[Path]:
    """The scripted tiers' script files that lie inside ``folder``."""
    scripts = [Path(t.model.removeprefix(SCRIPTED_PREFIX)) for t in config.tiers if t.is_scripted]
    return [script for script in scripts if script.is_relative_to(folder.resolve())]


def _resolve_scripted_paths(data: dict[str, Any], base: Path) -> None:
    """Make ``scripted/<relative path>`` models absolute, relative to the config's folder."""
    tiers = data.get("tiers")
    if not isinstance(tiers, list):
        return
    for tier in tiers:
        model = tier.get("model") if isinstance(tier, dict) else None
        if isinstance(model, str) and model.startswith(SCRIPTED_PREFIX):
            try:
                script = Path(model.removeprefix(SCRIPTED_PREFIX)).expanduser()
                script = (script if script.is_absolute() else base / script).resolve()
            except (RuntimeError, ValueError, OSError) as exc:  # ~nobody/, a NUL byte...
                raise ConfigError(f"tier model {model!r} is not a usable path: {exc}") from None
            tier["model"] = SCRIPTED_PREFIX + str(script)
